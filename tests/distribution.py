"""Distribution tests shared by the sampling tests: the G-test against an exact distribution, and the
exact distribution of a target's first tokens, enumerated from the model itself.

The G statistic, G = 2 N KL(empirical || exact), is chi-square distributed with (outcomes - 1) degrees
of freedom when the sampler is exact. Tolerance: KL <= chi2_{0.999}(df) / (2 N). Tests draw with a
fixed set of seeds, so each is the same test on every run.
"""
from __future__ import annotations

import math
from collections import Counter
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


def target_next_probs(model_dir, params) -> Callable[[list[int]], torch.Tensor]:
    """next_probs for a checkpoint in float32: one full forward per prefix, warped as the engine warps."""
    from specdec.core.sampling import warp
    from specdec.models.loader import load_model

    model = load_model(model_dir, torch.float32).model

    @torch.inference_mode()
    def next_probs(ids: list[int]) -> torch.Tensor:
        return warp(model(input_ids=torch.tensor([ids])).logits[0, -1], params)

    return next_probs


def assert_follows(samples: list[tuple[int, ...]], exact: dict) -> None:
    """G-test of the samples (tuples of first tokens) against the exact distribution."""
    kl, tolerance = g_test_kl(Counter(samples), exact, len(samples))
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f} over {len(samples)} draws"
