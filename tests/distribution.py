"""Distribution tests shared by the sampling tests: the G-test against an exact distribution, and the
exact distribution of a target's first tokens, enumerated from the model itself.

The G statistic, G = 2 N KL(empirical || exact), is chi-square distributed with (outcomes - 1) degrees
of freedom when the sampler is exact. Tolerance: KL <= chi2_{0.999}(df) / (2 N). Tests draw with a
fixed set of seeds, so each is the same test on every run.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable

import torch

from specdec.bench.distribution import exact_joint, g_test_kl  # noqa: F401 (the tests import them from here)


def target_next_probs(model_dir, params, dtype: torch.dtype = torch.float32) -> Callable[[list[int]], torch.Tensor]:
    """next_probs for a checkpoint (float32 unless dtype says): one full forward per prefix, warped as the
    engine warps. In bfloat16 the forward runs on specdec's kernels, as the engine's does: bf16's roundings
    are the kernels' own, and the distribution under test is that target's."""
    from specdec.core.sampling import warp
    from specdec.models.loader import load_model
    from specdec.models.runner import ModelRunner

    model = load_model(model_dir, dtype).model
    if dtype == torch.bfloat16:
        ModelRunner(model)  # installs specdec's linear, norm, attention and rotary kernels into the model

    @torch.inference_mode()
    def next_probs(ids: list[int]) -> torch.Tensor:
        return warp(model(input_ids=torch.tensor([ids])).logits[0, -1], params)

    return next_probs


def assert_follows(samples: list[tuple[int, ...]], exact: dict) -> None:
    """G-test of the samples (tuples of first tokens) against the exact distribution."""
    kl, tolerance = g_test_kl(Counter(samples), exact, len(samples))
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f} over {len(samples)} draws"
