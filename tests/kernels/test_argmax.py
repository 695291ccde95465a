"""Greedy picks on the kernel (specdec/kernels/argmax.cpp): every path this CPU runs gives torch's own answer,
the first of tied maxima with a NaN counting as the maximum, whatever the row length (whole vectors or a
tail), and a ModelRunner on specdec's kernels picks with it."""
from __future__ import annotations

import pytest
import torch

from specdec.core.sampling import greedy_ids
from specdec.kernels.build import load_kernel

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(KERNEL.module is None, reason=f"no kernels ({KERNEL.reason})")
# the kernel's paths: 0 scalar, 2 AVX-512 (an AVX2 CPU runs torch's pick instead: ModelRunner.greedy_ids)
PATHS = [p for p in (0, 2) if KERNEL.module is not None and p <= KERNEL.module.rows_isa()]
LENGTHS = [1, 2, 15, 16, 17, 31, 32, 33, 100, 49152, 49153]


def expected(logits: torch.Tensor) -> torch.Tensor:
    """torch's pick, asked two ways that must agree: what the engine used before, and argmax itself."""
    picked = greedy_ids(logits)
    assert torch.equal(picked, logits.argmax(dim=-1))
    return picked


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n", LENGTHS)
def test_distinct_values(isa, n):
    logits = torch.randn(5, n, generator=torch.Generator().manual_seed(n)) * 10
    assert torch.equal(KERNEL.module.argmax_rows(logits, isa), expected(logits))


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n", LENGTHS)
def test_ties_pick_the_first(isa, n):
    gen = torch.Generator().manual_seed(n)
    logits = torch.randint(-2, 3, (6, n), generator=gen).float()  # every long row full of tied maxima
    logits[1] = 0.0
    logits[1, n // 2:] = -0.0  # +0.0 and -0.0 tie: the first one wins
    logits[2] = -0.0
    logits[3] = float("-inf")  # all -inf: index 0
    logits[4, -1] = float("inf")  # a lone maximum in the last element (the tail when n % 16)
    logits[5, n // 3] = float("inf")
    logits[5, -1] = float("inf")
    got = KERNEL.module.argmax_rows(logits, isa)
    assert torch.equal(got, expected(logits))
    assert got[3] == 0 and got[4] == n - 1 and got[5] == n // 3


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("n", LENGTHS)
def test_a_nan_is_the_maximum(isa, n):
    logits = torch.randn(4, n, generator=torch.Generator().manual_seed(n))
    logits[0, n - 1] = float("nan")  # last element: the tail, or the last whole vector
    logits[1, n // 2] = float("nan")
    logits[1, -1] = float("nan")  # two NaNs: the first
    logits[2, 0] = float("inf")
    logits[2, n // 2] = float("nan")  # after an infinity
    logits[3] = float("nan")
    got = KERNEL.module.argmax_rows(logits, isa)
    assert torch.equal(got, expected(logits))
    assert got.tolist() == [n - 1, n // 2, n // 2 if n > 1 else 0, 0]


def test_rows_are_independent():
    """A row's pick is the same alone or among others (the step reads a batch's rows at once)."""
    logits = torch.randn(9, 49152, generator=torch.Generator().manual_seed(1))
    together = KERNEL.module.argmax_rows(logits, PATHS[-1])
    for r in range(9):
        assert KERNEL.module.argmax_rows(logits[r:r + 1], PATHS[-1]).item() == together[r].item()


def test_bad_input_is_refused():
    with pytest.raises(RuntimeError, match="float32"):
        KERNEL.module.argmax_rows(torch.zeros(2, 8, dtype=torch.bfloat16), 0)
    with pytest.raises(RuntimeError, match="isa"):
        KERNEL.module.argmax_rows(torch.zeros(2, 8), 7)


def test_runner_picks_with_the_kernel_on_avx512():
    from specdec.models.loader import load_model
    from specdec.models.runner import ModelRunner, RunnerConfig

    runner = ModelRunner(load_model(None, torch.float32).model, config=RunnerConfig(linear_kernel="specdec"))
    assert (runner.argmax_kernel is not None) == (KERNEL.module.rows_isa() == 2)
    logits = torch.randn(3, runner.vocab_size, generator=torch.Generator().manual_seed(2))
    logits[1, 5] = float("nan")
    assert torch.equal(runner.greedy_ids(logits), expected(logits))
    assert torch.equal(runner.greedy_ids(logits.bfloat16()), expected(logits.bfloat16()))  # torch's pick
