"""How many threads a lean forward runs on, chosen by measured cost: a team of all of torch's threads, or
the calling thread alone.

The team splits every product, attention and norm of the forward between its threads, which meet ~240
times a forward. On an idle machine that makes plain decoding of SmolLM2 ~1.4x faster at two threads. When
another process keeps a core busy, the team's second thread waits for that core at every meeting, and a
forward on one thread is faster (plain decoding beside one busy process: 29 tok/s as a team, 44 alone).
Neither is right everywhere and the load changes while a server runs, so each size of forward (its row
count, by powers of two) keeps a running mean of both ways, runs the cheaper one, and now and then re-times
the other. A way's cost is the median of its last few forwards: one slow forward (a page fault, the
garbage collector) must not send the server the slower way until the next probe. Both ways give bitwise
the same results (tests/kernels/test_lean.py), so the choice is speed only.

A probe is dear: on an idle machine a forward alone takes ~1.9x a team's (SmolLM2 float32, one row: 33
against 17 ms), and probing every 32nd forward of every size cost ~2% of decoding. So a probe that
confirms the team doubles that size's interval (up to `max_probe_every`), one that overturns it resets
it, and a neighbour taking a core is seen without probing: the chosen way's own cost moving by more than
`drift` from what it was when the other way was last timed probes at once. The neighbour leaving is not
seen so (one thread barely feels it), so while one thread is cheaper the interval stays the shortest.
`num_probes` counts the forwards run the slower way on purpose (warm-up and probes): their times are not
what a step costs, and the speculation policy, which learns its step costs from wall time, skips them
(specdec.step.verify_timed, which the in-process step and the target worker both verify through).
"""
from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

TEAM, ALONE = 0, 1


@dataclass(frozen=True)
class TeamConfig:
    num_warmup: int = 3  # forwards of a size timed each way before choosing
    probe_every: int = 32  # the shortest interval, in forwards of a size, between runs of the way not chosen
    max_probe_every: int = 512  # the longest, reached by doubling while probes confirm the choice
    drift: float = 0.2  # the chosen way's cost moving this far (relative) since the last probe: probe now
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

    @property
    def cost_ms(self) -> float:
        return self.cost_s * 1e3 if self.recent_s else float("nan")


@dataclass
class _Size:
    """One size class: both ways' timings and when to probe next."""

    ways: tuple[_Timing, _Timing] = field(default_factory=lambda: (_Timing(), _Timing()))  # (team, alone)
    since_probe: int = 0  # forwards since the way not chosen last ran
    interval: int = 0
    chosen_at_probe: float | None = None  # the chosen way's cost when the other was last timed

    def warmed(self, num_warmup: int) -> bool:
        """Both ways timed `num_warmup` times: from here on the cheaper runs and the other is probed."""
        return min(w.count for w in self.ways) >= num_warmup

    def cheaper(self) -> int:
        team, alone = self.ways
        if not alone.recent_s or (team.recent_s and team.cost_s <= alone.cost_s):
            return TEAM
        return ALONE


class TeamPolicy:
    """Per forward size: threads to run on (`threads`), then the time it took (`record`)."""

    def __init__(self, config: TeamConfig = TeamConfig()):
        self.config = config
        self._sizes: dict[int, _Size] = {}
        self.num_probes = 0  # forwards run the way not (yet) found cheaper: warm-up and probes

    def threads(self, num_rows: int, available: int) -> int:
        """Threads for a forward of `num_rows` rows when torch has `available` (1 = the calling thread)."""
        if available <= 1:
            return 1
        cfg = self.config
        size = self._sizes.setdefault(num_rows.bit_length(), _Size(interval=cfg.probe_every))
        team, alone = size.ways
        best = size.cheaper()
        if not size.warmed(cfg.num_warmup):
            way = TEAM if team.count <= alone.count else ALONE
        else:
            size.since_probe += 1
            chosen_s = size.ways[best].cost_s
            drifted = size.chosen_at_probe is not None and abs(chosen_s / size.chosen_at_probe - 1) > cfg.drift
            way = best
            if size.since_probe >= size.interval or drifted:
                way = 1 - best
                size.since_probe = 0
                size.chosen_at_probe = None  # set again once the probe is timed (record)
        if way != best:
            self.num_probes += 1
        return available if way == TEAM else 1

    def record(self, num_rows: int, threads: int, seconds: float) -> None:
        """The wall time of a forward of `num_rows` rows run on `threads` threads."""
        size = self._sizes.get(num_rows.bit_length())
        if size is None:
            return
        best, warm = size.cheaper(), size.warmed(self.config.num_warmup)
        way = TEAM if threads > 1 else ALONE
        size.ways[way].add(seconds, self.config.window)
        if warm and way != best:  # a probe, timed
            if size.cheaper() == best == TEAM:  # the team confirmed: probe less often
                size.interval = min(2 * size.interval, self.config.max_probe_every)
            else:  # overturned, or one thread still cheaper: watch closely (see the class docstring)
                size.interval = self.config.probe_every
        if size.chosen_at_probe is None and size.warmed(self.config.num_warmup):
            size.chosen_at_probe = size.ways[size.cheaper()].cost_s

    def costs_ms(self) -> dict[int, tuple[float, float]]:
        """Size class (rows up to 2**k - 1) -> (team, alone) costs in ms, for logs and benchmarks."""
        return {bits: (size.ways[TEAM].cost_ms, size.ways[ALONE].cost_ms) for bits, size in self._sizes.items()}
