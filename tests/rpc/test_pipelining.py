"""The draft worker's tree helpers: what 'all of step n accepted' means, and re-rooting."""
import torch

from draft_service.worker import first_path, split_first
from specdec.core.tree import DraftTree


def test_first_path_of_chain_and_tree():
    assert first_path(DraftTree.chain([1, 2, 3])) == [1, 2, 3]
    assert first_path(DraftTree((1, 2, 3, 4), (-1, -1, 0, 0))) == [1, 3]
    assert first_path(DraftTree.empty()) == []


def test_split_first_reroots_the_first_subtree():
    q = torch.eye(5)[[1, 2, 3, 4]]
    guess, rest = split_first(DraftTree((1, 2, 3, 4), (-1, -1, 0, 2), q))
    assert guess == 1
    assert rest.token_ids == (3, 4) and rest.parent_ids == (-1, 0)
    assert torch.equal(rest.q, q[[2, 3]])
    guess, rest = split_first(DraftTree.chain([7]))
    assert guess == 7 and rest.num_nodes == 0
