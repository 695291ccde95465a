"""The G-test of sampled outputs against an exact distribution, and that exact distribution for a
model's first tokens, enumerated from the model itself (the sampling tests and the GPU check share it).

The G statistic, G = 2 N KL(empirical || exact), is chi-square distributed with (outcomes - 1) degrees
of freedom when the sampler is exact. Tolerance: KL <= chi2_{0.999}(df) / (2 N).
"""
from __future__ import annotations

import math
from typing import Callable

import torch


def g_test_kl(counts: dict, exact: dict, n: int) -> tuple[float, float]:
    """(KL(empirical || exact), tolerance); outcomes with expected count < 5 are pooled."""
    unexpected = sum(c for outcome, c in counts.items() if exact.get(outcome, 0.0) == 0.0)
    if unexpected:  # an outcome of probability 0 was drawn: no tolerance covers that
        return math.inf, 0.0
    pooled_obs, pooled_exp, obs, exp = 0, 0.0, [], []
    for outcome, prob in exact.items():
        if prob * n < 5:
            pooled_obs += counts.get(outcome, 0)
            pooled_exp += prob
        else:
            obs.append(counts.get(outcome, 0))
            exp.append(prob)
    if pooled_exp > 0:
        obs.append(pooled_obs)
        exp.append(pooled_exp)
    kl = sum((o / n) * math.log((o / n) / e) for o, e in zip(obs, exp) if o > 0)
    df = max(len(obs) - 1, 1)
    z = 3.09  # 0.999 quantile of N(0, 1); Wilson-Hilferty approximation of chi2_{0.999}(df)
    crit = df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3
    return kl, crit / (2 * n)


def exact_joint(next_probs: Callable[[list[int]], torch.Tensor], prompt: list[int], num_tokens: int = 2
                ) -> dict[tuple[int, ...], float]:
    """P(first num_tokens emitted tokens), enumerating every prefix of non-zero probability.

    next_probs(ids) -> [vocab]: the target's warped distribution after ids. Use with top-k or top-p,
    which keep the enumeration small.
    """
    joint = {(): 1.0}
    for _ in range(num_tokens):
        grown = {}
        for prefix, prob in joint.items():
            p = next_probs(prompt + list(prefix))
            for token in torch.nonzero(p).flatten().tolist():
                grown[prefix + (token,)] = prob * float(p[token])
        joint = grown
    return joint
