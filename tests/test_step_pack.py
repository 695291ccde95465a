"""The one-sequence short path of a verify step's packing gives the batched layout's tensors exactly."""
from types import SimpleNamespace

import pytest
import torch

from specdec.core.tree import DraftTree, tree_layout
from specdec.step_pack import _pack_batch, pack, tree_part

SHAPES = [(), (-1,), (-1, 0, 1), (-1, -1, 0, 0, 2, -1, 4), (-1, 0, -1, 2, 0, 1, 5, 5)]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("parents", SHAPES)
@pytest.mark.parametrize("length", [1, 7, 40])
def test_one_sequence_matches_the_batched_layout(parents, length, dtype):
    runner = SimpleNamespace(device=torch.device("cpu"), dtype=dtype)
    seq = SimpleNamespace(context=[5, 9, 11])
    tree = DraftTree(tuple(100 + i for i in range(len(parents))), parents)
    layout = tree_layout(tree.parent_ids)
    got = pack(runner, [seq], [tree], [layout], [length])
    want = _pack_batch(runner, [seq], [tree], [layout], [length])
    for a, b in zip(got, want):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)


def test_causal_one_sequence_has_no_mask():
    runner = SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16)
    seq = SimpleNamespace(context=[5, 9, 11])
    tree = DraftTree.chain([3, 4])
    ids, bias, positions = pack(runner, [seq], [tree], [tree_layout(tree.parent_ids)], [12], causal=True)
    assert bias is None
    assert ids.tolist() == [[11, 3, 4]] and positions.tolist() == [[12, 13, 14]]


def test_a_shape_is_laid_out_once_and_left_unchanged():
    runner = SimpleNamespace(device=torch.device("cpu"), dtype=torch.bfloat16)
    seq = SimpleNamespace(context=[1])
    tree = DraftTree((7, 8, 9), (-1, -1, 0))
    layout = tree_layout(tree.parent_ids)
    before = tree_part(tree.parent_ids, torch.bfloat16, torch.device("cpu"))
    kept = (before[0].clone(), before[1].clone())
    for length in (3, 4):  # the step's tensors are new ones: writing them leaves the shared parts alone
        ids, bias, positions = pack(runner, [seq], [tree], [layout], [length])
        bias.fill_(1.0)
        positions.fill_(-1)
    after = tree_part(tree.parent_ids, torch.bfloat16, torch.device("cpu"))
    assert after[0] is before[0] and torch.equal(after[0], kept[0]) and torch.equal(after[1], kept[1])
