import torch

pytestmark = __import__("pytest").mark.usefixtures("one_thread")

from specdec.core import kv
from specdec.core.tree import DraftTree, tree_layout
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner


def test_commit_keeps_accepted_path_like_sequential_decoding(tiny_target):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model)
    prefix = [3, 14, 15, 92, 65]
    tree = DraftTree((20, 21, 22, 23, 24), (-1, -1, 1, 2, 0))
    cache = runner.new_cache()
    runner.forward(prefix[:-1], cache, want_logits=False)
    num_cached = kv.num_cached(cache)
    runner.forward([prefix[-1], *tree.token_ids], cache, tree_layout(tree.parent_ids))
    accepted_rows = [2, 3, 4]  # nodes 1 -> 2 -> 3: tokens 21, 22, 23
    kv.keep_rows(cache, num_cached, [0, *accepted_rows])
    reference = runner.new_cache()
    runner.forward(prefix + [21, 22, 23], reference, want_logits=False)
    assert kv.num_cached(cache) == kv.num_cached(reference) == len(prefix) + 3
    for got, want in zip(cache.layers, reference.layers):
        assert torch.allclose(got.keys, want.keys, atol=1e-5)
        assert torch.allclose(got.values, want.values, atol=1e-5)
    # The next step from the committed cache sees exactly the sequential context.
    nxt, _ = runner.forward([7], cache)
    ref, _ = runner.forward([7], reference)
    assert torch.allclose(nxt, ref, atol=1e-4)


def test_chain_commit_and_rollback(tiny_target):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model)
    cache = runner.new_cache()
    runner.forward([1, 2, 3, 4], cache, want_logits=False)
    runner.forward([5, 6, 7], cache, tree_layout((-1, 0)))
    kv.keep_rows(cache, 4, [0, 1])
    assert kv.num_cached(cache) == 6
    kv.crop(cache, 2)
    assert kv.num_cached(cache) == 2
    kv.crop(cache, 10)  # longer than the cache: nothing happens
    assert kv.num_cached(cache) == 2
