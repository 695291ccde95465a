"""greedy_ids' blocked two-pass answer is max(dim)'s: the first maximum, NaN winning."""
import pytest
import torch

from specdec.core.sampling import BLOCK, greedy_ids


def reference(logits):
    return logits.max(dim=-1).indices


@pytest.mark.parametrize("seed", range(40))
def test_blocked_pick_is_the_first_maximum(seed):
    gen = torch.Generator().manual_seed(seed)
    rows, vocab = 4 + seed % 9, BLOCK * (1 + seed % 5)
    if seed % 2:  # few distinct values: many ties, across and inside blocks
        logits = torch.randint(-2, 3, (rows, vocab), generator=gen).float()
    else:
        logits = torch.randn(rows, vocab, generator=gen).bfloat16().float()
    if seed % 3 == 0:
        at = torch.randint(rows * vocab, (3,), generator=gen)
        logits.view(-1)[at] = float("nan")
    if seed % 5 == 0:
        logits[1] = float("-inf")
    if seed % 7 == 0:
        logits[2] = float("inf")
        logits[2, vocab - 3] = float("nan")
    got = greedy_ids(logits)
    assert got.dtype == torch.long
    assert torch.equal(got, reference(logits))


def test_the_maximum_late_in_a_row_and_ties_across_blocks():
    logits = torch.zeros(5, 4 * BLOCK)
    logits[0, -1] = 1.0
    logits[1, [BLOCK - 1, 3 * BLOCK]] = 2.0  # the first of two equal maxima, in different blocks
    logits[2, [2 * BLOCK + 5, 2 * BLOCK + 7]] = 3.0  # two in one block
    assert greedy_ids(logits).tolist() == [4 * BLOCK - 1, BLOCK - 1, 2 * BLOCK + 5, 0, 0]


def test_other_shapes_fall_back():
    x = torch.randn(3, 7, 2 * BLOCK)  # [..., vocab] with more dims
    assert torch.equal(greedy_ids(x), reference(x))
    y = torch.randn(6, BLOCK + 1)  # vocabulary not whole blocks
    assert torch.equal(greedy_ids(y), reference(y))
    z = torch.randn(6, 2 * BLOCK)[:, :BLOCK]  # not contiguous
    assert torch.equal(greedy_ids(z), reference(z))
