import pytest
import torch

pytestmark = __import__("pytest").mark.usefixtures("one_thread")

from specdec.core.tree import DraftTree, attention_bias, paths_to_parents, position_ids, retrieve_indices, tree_layout
from specdec.errors import InvalidArgument

# root -> a(0) -> c(2), root -> b(1), a -> d(3)
PARENTS = (-1, -1, 0, 0)


def test_layout_depths_children_mask():
    layout = tree_layout(PARENTS)
    assert layout.depths == (0, 1, 1, 2, 2)
    assert layout.children == ((1, 2), (3, 4), (), (), ())
    assert not layout.is_chain
    expected = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 1, 0, 0, 1]],
                            dtype=torch.bool)
    assert torch.equal(layout.mask, expected)
    assert tree_layout((-1, 0, 1)).is_chain


def test_bias_positions_retrieve():
    layout = tree_layout(PARENTS)
    bias = attention_bias(layout, num_cached=3, dtype=torch.float32)
    assert bias.shape == (1, 1, 5, 8)
    assert (bias[0, 0, :, :3] == 0).all()
    assert torch.equal(bias[0, 0, :, 3:] == 0, layout.mask)
    assert position_ids(layout, 3).tolist() == [[3, 4, 4, 5, 5]]
    assert retrieve_indices(layout).tolist() == [[0, 2, -1], [0, 1, 3], [0, 1, 4]]


def test_paths_to_parents_medusa_style():
    parents, ranks = paths_to_parents([(0,), (1,), (0, 0), (0, 1), (0, 0, 0)])
    assert parents == (-1, -1, 0, 0, 2)
    assert ranks == (0, 1, 0, 1, 0)
    with pytest.raises(InvalidArgument, match="no parent path"):
        paths_to_parents([(0,), (1, 0)])


@pytest.mark.parametrize("tree, word", [
    (DraftTree((1, 2), (-1, 5)), "parent index"),
    (DraftTree((1, 2), (-1, 1)), "parent index"),
    (DraftTree((1, 200), (-1, 0)), "outside the vocabulary"),
    (DraftTree((1,) * 9, tuple(range(-1, 8))), "more than the limit"),
    (DraftTree((1, 2), (-1,)), "parent ids"),
])
def test_validate_refuses_malformed(tree, word):
    with pytest.raises(InvalidArgument, match=word):
        tree.validate(vocab_size=100, max_nodes=8)


def test_tree_forward_matches_sequential_branches(tiny_target):
    """Logits of every tree row equal those from decoding that row's branch one token at a time."""
    from specdec.models.loader import load_model
    from specdec.models.runner import ModelRunner

    runner = ModelRunner(load_model(tiny_target, torch.float32).model)
    prefix = [5, 17, 33, 2, 9, 41]
    tree = DraftTree((7, 8, 9, 10, 11, 12), (-1, -1, 0, 0, 2, 1))
    cache = runner.new_cache()
    runner.forward(prefix[:-1], cache, want_logits=False)
    layout = tree_layout(tree.parent_ids)
    tree_logits, _ = runner.forward([prefix[-1], *tree.token_ids], cache, layout)
    for row in range(layout.num_rows):
        path, r = [], row
        while r > 0:
            path.append(tree.token_ids[r - 1])
            r = layout.parent_rows[r]
        seq_cache = runner.new_cache()
        logits, _ = runner.forward(prefix + path[::-1], seq_cache)
        assert torch.allclose(tree_logits[row], logits[-1], atol=1e-4), f"row {row}"
