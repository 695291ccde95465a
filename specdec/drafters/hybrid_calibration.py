"""What a hybrid node's score is worth, learnt from what the target committed.

The two sources score on different scales, and neither is a probability on Spec-Bench: measured on
12 held-out questions (greedy, 64 tokens), Medusa's path products were accepted about half as often
as they promised (score 0.5 -> 0.22), and suffix decoding's blended probabilities were flat over most
of their range (0.1 to 0.8 -> 0.04 to 0.14 accepted) and right only above 0.8. One policy
calibration scale per sequence cannot fix both at once, so each source keeps, per score bin, decayed
counts of nodes whose outcome is known and of those accepted, and a node's score becomes its bin's
acceptance rate (pulled toward the raw score by a prior worth PRIOR_NODES nodes).

Outcomes come from the context alone: a node drafted at context length n is accepted exactly when
its path equals the tokens committed after n (greedy: the target's own continuation, whether the
node was verified or cut). Deeper than what was committed, a node whose path agrees so far has no
known outcome and is skipped. All of it depends on committed tokens only, so the trees stay functions
of the past (exact under sampling too: specdec.policy).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field

NUM_BINS = 10
PRIOR_NODES = 4.0  # the raw score's weight, in nodes, against a bin's counts
DECAY = 0.995  # per recorded node of that bin: ~200 nodes of memory


@dataclass
class BinCounts:
    seen: list[float] = field(default_factory=lambda: [0.0] * NUM_BINS)
    accepted: list[float] = field(default_factory=lambda: [0.0] * NUM_BINS)


def score_bin(score: float) -> int:
    return min(int(score * NUM_BINS), NUM_BINS - 1)


class ScoreCalibration:
    """Per source and score bin, how often nodes so scored were accepted. Shared by a drafter's
    sessions (the machine's workload, not one sequence's), so reads and writes take `lock`."""

    def __init__(self, sources: tuple[str, ...]):
        self.counts = {source: BinCounts() for source in sources}
        self.lock = threading.Lock()

    def calibrated(self, source: str, score: float) -> float:
        b = score_bin(score)
        with self.lock:
            counts = self.counts[source]
            seen, accepted = counts.seen[b], counts.accepted[b]
        return (accepted + PRIOR_NODES * score) / (seen + PRIOR_NODES)

    def record(self, source: str, outcomes: list[tuple[float, bool]]) -> None:
        """outcomes: (raw score, accepted) of nodes whose outcome is known."""
        with self.lock:
            counts = self.counts[source]
            for score, ok in outcomes:
                b = score_bin(score)
                counts.seen[b] = DECAY * counts.seen[b] + 1.0
                counts.accepted[b] = DECAY * counts.accepted[b] + float(ok)


def outcomes(paths: list[tuple[tuple[int, ...], float]], committed: list[int]) -> list[tuple[float, bool]]:
    """(score, accepted) of each drafted (path, score) whose outcome `committed` (the tokens that
    followed the draft's context) decides; a path deeper than it and agreeing with it is skipped."""
    known = []
    for path, score in paths:
        if len(path) <= len(committed):
            known.append((score, tuple(committed[:len(path)]) == path))
        elif tuple(committed) != path[:len(committed)]:
            known.append((score, False))
    return known


def token_paths(token_ids: tuple[int, ...], parent_ids: tuple[int, ...]) -> list[tuple[int, ...]]:
    """Each node's token path from the root (parents come before children)."""
    paths: list[tuple[int, ...]] = []
    for token, parent in zip(token_ids, parent_ids):
        paths.append((paths[parent] if parent >= 0 else ()) + (token,))
    return paths
