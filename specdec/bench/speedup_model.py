"""What speedup a drafter would reach on a machine, from that machine's verify cost curve and the
drafter's acceptance measured elsewhere (benchmarks/gpu_check.py: a GPU's curve, the CPU's acceptance).

For one sequence at batch B, a drafter that drafts on a share s of the steps (prompt lookup finds no
match on the others) and proposes depth k there:

    tokens per step  E_k  = 1 + s * sum_{i=1..k} P(A >= i)
    time per step    T_k  = (1 - s) + s * (c(B, k + 1) / c(B, 1) + k * r)        (in one-row steps)
    speedup          S_k  = E_k / T_k,  and the drafter's figure is max over k >= 0 of S_k (S_0 = 1)

where P(A >= i) is the measured share of drafted steps that accepted at least i tokens (from the
accepted-length histogram), c(B, n) the measured milliseconds of one verify forward of n rows per
sequence at batch B (interpolated linearly between measured row counts), and r a drafter forward's
cost relative to the target's one-row step: 0 for prompt lookup and suffix decoding (host-side
lookups), a stated assumption for model drafters. It is a model: acceptance measured with another
target, at the depths that target's adaptive policy chose, carried over to another cost curve.
"""
from __future__ import annotations

# A drafter forward relative to the target's one-row step, on a GPU, bandwidth-bound: an 8B target with
# a ~1B draft model (1/8) or an EAGLE-style head (one decoder layer plus the LM head: ~1/20).
DRAFT_COST_RATIO = {"ngram": 0.0, "suffix": 0.0, "draft": 0.125, "eagle": 0.05, "eagle3": 0.05}
MAX_DEPTH = 8


def acceptance_tail(histogram: list[int]) -> list[float]:
    """histogram[j] = drafted steps that accepted exactly j tokens -> [P(A >= 1), ..., P(A >= len - 1)]."""
    total = sum(histogram)
    if not total:
        return []
    return [sum(histogram[i:]) / total for i in range(1, len(histogram))]


def cost_ratio(curve: dict[int, float], rows: int) -> float:
    """c(rows) / c(1) from a curve {rows: ms} measured at some row counts (linear in between)."""
    points = sorted(curve)
    if rows <= points[0]:
        value = curve[points[0]]
    elif rows >= points[-1]:
        value = curve[points[-1]] * rows / points[-1]  # beyond the curve: proportional (pessimistic)
    else:
        lo = max(p for p in points if p <= rows)
        hi = min(p for p in points if p >= rows)
        value = curve[lo] if lo == hi else curve[lo] + (curve[hi] - curve[lo]) * (rows - lo) / (hi - lo)
    return value / curve[points[0]]


def speedup(tail: list[float], share: float, curve: dict[int, float], depth: int, draft_ratio: float) -> float:
    """S_k of the module docstring for depth k = `depth`."""
    tokens = 1.0 + share * sum(tail[:depth])
    time = (1.0 - share) + share * (cost_ratio(curve, depth + 1) + depth * draft_ratio)
    return tokens / time


def best_speedup(tail: list[float], share: float, curve: dict[int, float], draft_ratio: float,
                 max_depth: int = MAX_DEPTH) -> tuple[float, int]:
    """(max over k in 0..max_depth of S_k, the k that reaches it); k = 0 is not speculating (S_0 = 1),
    which the speculation policy falls back to where no depth pays."""
    if not tail or share <= 0:
        return 1.0, 0
    return max([(1.0, 0)] + [(speedup(tail, share, curve, k, draft_ratio), k) for k in range(1, max_depth + 1)])
