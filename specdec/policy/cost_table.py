"""Seconds per verify forward against its padded row count, as the speculation policy has measured them.

The batch budget (specdec.policy.budget) keeps one table for every batch size together and one per batch
size; a sequence's own controller (specdec.policy.depth) keeps one for its scored steps.
"""
from __future__ import annotations

import bisect


class CostTable:
    """Seconds per verify forward against its padded row count: decayed means per measured count.

    An estimate is never above a larger count's mean: a forward over more rows does not cost less, so a
    count that measured dearer than a larger one caught a passing stall (the first measurement of a
    count is its mean outright). Without this bound, one stalled step made its count look dear for
    good: the policy stops choosing it, so it is never measured again (suffix decoding on a JSON prompt
    then verified no 8-node tree for the rest of the answer: tau 1.54 against 1.68-1.76)."""

    def __init__(self, decay: float):
        self.decay = decay
        self.means: dict[int, float] = {}

    def record(self, num_rows: int, seconds: float) -> None:
        old = self.means.get(num_rows)
        self.means[num_rows] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def estimate(self, num_rows: int) -> float | None:
        return self.estimate_many([num_rows])[0]

    def estimate_many(self, counts: list[int]) -> list[float | None]:
        """estimate() of each count, the means sorted once."""
        known = sorted(self.means)
        floors = [0.0] * len(known)  # floors[i]: the least mean of known[i:]
        least = float("inf")
        for i in range(len(known) - 1, -1, -1):
            least = floors[i] = min(least, self.means[known[i]])
        out = []
        for num_rows in counts:
            seconds = self._estimate(num_rows, known)
            above = bisect.bisect_right(known, num_rows)  # the first count larger than num_rows
            out.append(seconds if seconds is None or above == len(known) else min(seconds, floors[above]))
        return out

    def _estimate(self, num_rows: int, known: list[int]) -> float | None:
        if num_rows in self.means:
            return self.means[num_rows]
        if not known:
            return None
        at = bisect.bisect(known, num_rows)
        if at == 0:  # below every measured count: proportional to the smallest
            return self.means[known[0]] * num_rows / known[0]
        lo = known[at - 1]
        if at == len(known):  # above: extend the line through the two largest, never below proportional/2
            slope = self.means[lo] / lo / 2
            if len(known) >= 2:
                slope = max(slope, (self.means[lo] - self.means[known[-2]]) / (lo - known[-2]))
            return self.means[lo] + slope * (num_rows - lo)
        hi = known[at]
        w = (num_rows - lo) / (hi - lo)
        return (1 - w) * self.means[lo] + w * self.means[hi]
