"""Verify-forward costs measured once at start, so a load-aware policy starts from the machine's real
cost curve instead of learning it from its own first steps.

Why. The batch budget (specdec.policy.budget) extrapolates costs above the row counts it has seen
from the slope between the two largest. A worker's first speculative step is its slowest (cold caches,
the drafter's first call): measured once at 3 rows, it made 3 rows look 1.3x a one-row forward where a
warm one costs 1.02x, the extrapolation priced larger trees higher still, the budget chose plain steps,
and plain steps never measure a speculative one again, only rare probes (a served hybrid drafter at one
user: tau 1.17 against 1.80 with the batch budget off, 113 against 135 tok/s). Timing a few warm forwards
over a scratch cache at start costs ~0.3 s and gives every row count a fair first estimate; recorded
steps then move the means as before (including what drafting costs).
"""
from __future__ import annotations

import time

import torch

from specdec.core import kv

ROW_COUNTS = (1, 2, 3, 5, 9, 17, 33)  # padded rows of a verify forward (batch x (1 + nodes))
CACHED_TOKENS = 256  # a typical cached context while decoding


def forward_costs(runner, row_counts: tuple[int, ...] = ROW_COUNTS, cached: int = CACHED_TOKENS,
                  repeats: int = 3) -> tuple[tuple[int, float], ...]:
    """((rows, seconds), ...): the fastest of `repeats` forwards (logits included) of each row count
    over `cached` tokens of one scratch sequence, on this runner's device and kernels."""
    cache = runner.new_cache(cached + max(row_counts))
    vocab = min(runner.vocab_size, 1000)
    runner.forward([(7 * i) % vocab for i in range(cached)], cache, want_logits=False)  # the context
    costs = []
    for rows in row_counts:
        best = float("inf")
        for _ in range(repeats + 1):  # one more than asked: the first of each count warms its shapes
            start = time.perf_counter()
            runner.forward([(11 * i) % vocab for i in range(rows)], cache)
            if runner.device.type == "cuda":
                torch.cuda.synchronize(runner.device)
            best = min(best, time.perf_counter() - start)
            kv.trim(cache, cached)
        costs.append((rows, best))
    return tuple(costs)
