import pytest
import torch

pytestmark = pytest.mark.usefixtures("one_thread")
KINDS = pytest.mark.parametrize("kind", ["static", "dynamic"])

from specdec.batch_cache import BatchCache
from specdec.core import kv
from specdec.core.tree import DraftTree, tree_layout
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner, RunnerConfig


class Holder:
    """The least a BatchCache lends from: a cache and the two fields it sets."""

    def __init__(self, cache):
        self.cache, self.cache_lender, self.finish_reason = cache, None, None


@KINDS
def test_commit_keeps_accepted_path_like_sequential_decoding(tiny_target, kind):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(kv_cache=kind))
    prefix = [3, 14, 15, 92, 65]
    tree = DraftTree((20, 21, 22, 23, 24), (-1, -1, 1, 2, 0))
    holder = Holder(runner.new_cache())
    runner.forward(prefix[:-1], holder.cache, want_logits=False)
    pool = BatchCache(runner)
    cache, _ = pool.take([holder])  # a batch of one: the sequence's own cache
    runner.forward([prefix[-1], *tree.token_ids], cache, tree_layout(tree.parent_ids))
    pool.commit([[0, 2, 3, 4]])  # root, then nodes 1 -> 2 -> 3: tokens 21, 22, 23
    pool.release()
    reference = runner.new_cache()
    runner.forward(prefix + [21, 22, 23], reference, want_logits=False)
    assert kv.num_cached(holder.cache) == kv.num_cached(reference) == len(prefix) + 3
    for (keys, values), (want_keys, want_values) in zip(kv.entries(holder.cache), kv.entries(reference)):
        assert torch.allclose(keys, want_keys, atol=1e-5)
        assert torch.allclose(values, want_values, atol=1e-5)
    # The next step from the committed cache sees exactly the sequential context.
    nxt, _ = runner.forward([7], holder.cache)
    ref, _ = runner.forward([7], reference)
    assert torch.allclose(nxt, ref, atol=1e-4)


@KINDS
def test_rollback_undoes_a_forward_and_a_half_done_commit(tiny_target, kind):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(kv_cache=kind))
    holders = [Holder(runner.new_cache()) for _ in range(2)]
    runner.forward([1, 2, 3, 4], holders[0].cache, want_logits=False)
    runner.forward([5, 6], holders[1].cache, want_logits=False)
    before = [[keys.clone() for keys, _ in kv.entries(h.cache)] for h in holders]
    pool = BatchCache(runner)
    cache, lens = pool.take(holders)
    assert lens == [4, 2]
    for i in range(len(cache.layers) // 2):  # as if a forward died halfway through the layers
        keys, values = kv.entries(cache)[i]
        cache.update(keys[:, :, :3].clone(), values[:, :, :3].clone(), i)
    pool.rollback()
    pool.release()
    for h, keys in zip(holders, before):
        got = [k for k, _ in kv.entries(h.cache)]
        assert [torch.equal(a, b) for a, b in zip(got, keys)] == [True] * len(keys)


@KINDS
def test_crop_rolls_a_drafters_cache_back(tiny_target, kind):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(kv_cache=kind))
    cache = runner.new_cache()
    runner.forward([1, 2, 3, 4, 5, 6], cache, want_logits=False)
    kv.crop(cache, 2)
    assert kv.num_cached(cache) == 2
    kv.crop(cache, 10)  # longer than the cache: nothing happens
    assert kv.num_cached(cache) == 2
