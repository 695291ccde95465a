"""How many threads a lean forward runs on, chosen by measured cost: a team of all of torch's threads, or
the calling thread alone.

The team splits every product, attention and norm of the forward between its threads, which meet ~240
times a forward. On an idle machine that makes plain decoding of SmolLM2 ~1.4x faster at two threads. When
another process keeps a core busy, the team's second thread waits for that core at every meeting, and a
forward on one thread is faster (plain decoding beside one busy process: 29 tok/s as a team, 44 alone).
Neither is right everywhere and the load changes while a server runs, so each size of forward (its row
count, by powers of two) keeps a running mean of both ways, runs the cheaper one, and now and then re-times
the other. A way's cost is the median of its last few forwards: one slow forward (a page fault, the
garbage collector) must not send the server the slower way until the next probe. Both ways give bitwise the same results (tests/kernels/test_lean.py), so the choice is speed only.
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

TEAM, ALONE = 0, 1


@dataclass(frozen=True)
class TeamConfig:
    num_warmup: int = 3  # forwards of a size timed each way before choosing
    probe_every: int = 32  # every Nth forward of a size runs the way not chosen, to see the load change
    window: int = 5  # a way's cost: the median of its last `window` forwards


@dataclass
class _Timing:
    recent_s: deque = field(default_factory=deque)
    count: int = 0

    def add(self, seconds: float, window: int) -> None:
        self.recent_s.append(seconds)
        if len(self.recent_s) > window:
            self.recent_s.popleft()
        self.count += 1

    @property
    def cost_s(self) -> float:
        return statistics.median(self.recent_s)


class TeamPolicy:
    """Per forward size: threads to run on (`threads`), then the time it took (`record`)."""

    def __init__(self, config: TeamConfig = TeamConfig()):
        self.config = config
        self._timings: dict[int, tuple[_Timing, _Timing]] = {}  # size class -> (team, alone)
        self._calls: dict[int, int] = {}

    def threads(self, num_rows: int, available: int) -> int:
        """Threads for a forward of `num_rows` rows when torch has `available` (1 = the calling thread)."""
        if available <= 1:
            return 1
        size = num_rows.bit_length()
        team, alone = self._timings.setdefault(size, (_Timing(), _Timing()))
        calls = self._calls[size] = self._calls.get(size, 0) + 1
        if team.count < self.config.num_warmup or alone.count < self.config.num_warmup:
            way = TEAM if team.count <= alone.count else ALONE
        else:
            way = TEAM if team.cost_s <= alone.cost_s else ALONE
            if calls % self.config.probe_every == 0:
                way = 1 - way
        return available if way == TEAM else 1

    def record(self, num_rows: int, threads: int, seconds: float) -> None:
        """The wall time of a forward of `num_rows` rows run on `threads` threads."""
        timings = self._timings.get(num_rows.bit_length())
        if timings is not None:
            timings[TEAM if threads > 1 else ALONE].add(seconds, self.config.window)

    def costs_ms(self) -> dict[int, tuple[float, float]]:
        """Size class (rows up to 2**k - 1) -> (team, alone) costs in ms, for logs and benchmarks."""
        return {size: (team.cost_s * 1e3, alone.cost_s * 1e3) for size, (team, alone) in self._timings.items()}
