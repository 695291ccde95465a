"""A drafting head's best candidates and their probabilities in one call (specdec/kernels/top_probs.cpp):
every path this CPU runs keeps a stable descending sort's first r (ties: the lower index first) and gives
softmax probabilities within float rounding, for float32 and bfloat16 logits, whole vectors or a tail."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels.build import ROWS_AVX512, load_kernel

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(KERNEL.module is None, reason=f"no kernels ({KERNEL.reason})")
PATHS = [p for p in (0, ROWS_AVX512) if KERNEL.module is not None and p <= KERNEL.module.rows_isa()]


def reference(logits: torch.Tensor, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    top = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :r]
    return top, torch.softmax(logits.float(), dim=-1).gather(1, top)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, r", [(1, 1), (5, 3), (16, 16), (17, 8), (100, 8), (8192, 8), (8195, 12)])
def test_matches_a_stable_sort_and_softmax(isa, dtype, n, r):
    logits = (torch.randn(4, n, generator=torch.Generator().manual_seed(n)) * 4).to(dtype)
    top, probs = KERNEL.module.top_probs(logits, r, isa)
    expected_top, expected_probs = reference(logits, r)
    assert torch.equal(top, expected_top)
    assert torch.allclose(probs, expected_probs, rtol=1e-4, atol=1e-9)
    top, logps = KERNEL.module.top_probs(logits, r, isa, log=True)
    assert torch.equal(top, expected_top)
    expected_logps = torch.log_softmax(logits.float(), dim=-1).gather(1, expected_top)
    assert torch.allclose(logps, expected_logps, rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("isa", PATHS)
def test_log_probabilities_do_not_underflow(isa):
    logits = torch.tensor([[0.0, -200.0, -400.0, 5.0]])  # e^-405 is 0 in float32; its log is not
    top, logps = KERNEL.module.top_probs(logits, 4, isa, log=True)
    assert top.tolist() == [[3, 0, 1, 2]]
    expected = torch.log_softmax(logits.double(), dim=-1)[0, [3, 0, 1, 2]]  # ~[-0.0067, -5.0067, -205.0067, ...]
    assert logps.tolist()[0] == pytest.approx(expected.tolist(), abs=1e-4)


@pytest.mark.parametrize("isa", PATHS)
def test_ties_keep_index_order(isa):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randint(-3, 2, (3, 1000), generator=gen).float()  # hundreds of tied maxima per row
    logits[1, 999] = 7.0  # a lone best in the tail, then the first tied ones
    logits[2] = 0.0
    top, probs = KERNEL.module.top_probs(logits, 8, isa)
    assert torch.equal(top, reference(logits, 8)[0])
    assert top[1].tolist()[0] == 999 and top[2].tolist() == list(range(8))
    assert torch.allclose(probs[2], torch.full((8,), 1e-3), rtol=1e-4)


@pytest.mark.parametrize("isa", PATHS)
def test_extreme_logits(isa):
    logits = torch.full((2, 40), -1e30)
    logits[0, 3], logits[0, 30] = 50.0, 49.0  # the rest underflow to zero probability
    logits[1, :] = float("-inf")
    logits[1, 21] = 0.0
    top, probs = KERNEL.module.top_probs(logits, 2, isa)
    assert top.tolist() == [[3, 30], [21, 0]]
    assert probs[0].tolist() == pytest.approx([1 / (1 + torch.e ** -1), 1 / (1 + torch.e)], rel=1e-5)
    assert probs[1].tolist() == [1.0, 0.0]


def test_bad_input_is_refused():
    with pytest.raises(RuntimeError, match="r must be"):
        KERNEL.module.top_probs(torch.zeros(2, 8), 9, 0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        KERNEL.module.top_probs(torch.zeros(2, 8, dtype=torch.float64), 2, 0)
    with pytest.raises(RuntimeError, match="isa"):
        KERNEL.module.top_probs(torch.zeros(2, 8), 2, 7)
