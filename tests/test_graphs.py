"""CUDA graphs: on a CPU the flag falls back to the eager forward (said once, outputs unchanged), and
the fixed-width padded forward that graphs capture gives the eager forward's tokens (run eagerly here)."""
from __future__ import annotations

import logging

import pytest

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.graphs import GraphedDecoder, bucket, capacity_bucket, ROW_BUCKETS

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41], [11, 12, 13, 11, 12, 13, 11, 12, 13, 14]]
CONFIGS = [dict(drafter="none"), dict(drafter="ngram", num_branches=2),
           dict(drafter="draft", tree_width=2, num_speculative_tokens=3)]


def test_buckets():
    assert [bucket(n, ROW_BUCKETS) for n in (1, 2, 3, 9, 64, 65)] == [1, 2, 4, 16, 64, None]
    assert [capacity_bucket(n) for n in (1, 256, 257, 1000)] == [256, 256, 512, 1024]


def test_the_flag_on_a_cpu_falls_back_to_eager(tiny_target, caplog):
    with caplog.at_level(logging.WARNING, logger="specdec.graphs"):
        graphed = Engine.from_pretrained(target=tiny_target, drafter="ngram", device="cpu", cuda_graphs=True,
                                         adaptive=False)
    plain = Engine.from_pretrained(target=tiny_target, drafter="ngram", device="cpu", adaptive=False)
    assert not graphed.runner.graphs.active and "need a CUDA device" in graphed.runner.graphs.reason
    assert "CUDA graphs off" in caplog.text
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    for prompt in PROMPTS:
        assert graphed.generate(prompt, params).token_ids == plain.generate(prompt, params).token_ids
    assert graphed.runner.graphs.shapes == set()  # nothing ran padded


def test_unset_on_a_cpu_is_eager_without_a_word(tiny_target, caplog):
    with caplog.at_level(logging.WARNING, logger="specdec.graphs"):
        engine = Engine.from_pretrained(target=tiny_target, drafter="ngram", device="cpu", adaptive=False)
        off = Engine.from_pretrained(target=tiny_target, drafter="ngram", device="cpu", adaptive=False,
                                     cuda_graphs=False)
    assert engine.runner.graphs is None and off.runner.graphs is None
    assert "CUDA graphs off" not in caplog.text


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["drafter"])
def test_fixed_width_padded_forward_equals_eager(tiny_target, tiny_noisy_draft, config):
    draft = tiny_noisy_draft if config["drafter"] == "draft" else None
    engines = [Engine.from_pretrained(target=tiny_target, draft=draft, device="cpu", adaptive=False,
                                      kv_cache=kind, **config) for kind in ("static", "dynamic")]
    padded, eager = engines
    padded.runner.graphs = GraphedDecoder(padded.runner, capture=False)  # what a graph replays, run eagerly
    assert padded.runner.graphs.active
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    for prompt in PROMPTS:
        assert padded.generate(prompt, params).token_ids == eager.generate(prompt, params).token_ids
    batched = generate_batch(padded, PROMPTS, params, max_batch=3)
    assert batched == generate_batch(eager, PROMPTS, params, max_batch=3)
    shapes = padded.runner.graphs.shapes
    assert {b for b, _, _ in shapes} >= {1, 4} and all(c in (256, 512) for _, _, c in shapes)
    if config["drafter"] != "none":
        assert max(n for _, n, _ in shapes) > 1  # trees went through padded row counts


def test_stores_are_pooled_so_graphs_outlive_a_request(tiny_target, tiny_noisy_draft):
    """A graph replays over the store it was captured with: each new request (and each batch of the same
    shape) must get that store back, not one at a new address, or its graphs are captured again."""
    engine = Engine.from_pretrained(target=tiny_target, draft=tiny_noisy_draft, drafter="draft", device="cpu",
                                    adaptive=False, kv_cache="static", num_speculative_tokens=3)
    eager = Engine.from_pretrained(target=tiny_target, draft=tiny_noisy_draft, drafter="draft", device="cpu",
                                   adaptive=False, kv_cache="dynamic", num_speculative_tokens=3)
    graphs = engine.runner.graphs = GraphedDecoder(engine.runner, capture=False)
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    for prompt in PROMPTS + PROMPTS[:1]:
        assert engine.generate(prompt, params).token_ids == eager.generate(prompt, params).token_ids
    assert graphs.num_stores == 1 and list(graphs.stores) == [(1, 256)]  # one store, taken by every request
    # no load-aware budget: it cuts trees by measured seconds, so how many sequences are left at each step (the
    # batch buckets, hence the stores) would follow the machine's load
    batched = generate_batch(engine, PROMPTS, params, max_batch=3, load_aware=False)
    assert batched == generate_batch(eager, PROMPTS, params, max_batch=3, load_aware=False)
    allocated = graphs.num_stores
    assert generate_batch(engine, PROMPTS, params, max_batch=3, load_aware=False) == batched
    assert graphs.num_stores == allocated and graphs.stores.keys() >= {(1, 256), (4, 256)}


def test_a_store_held_by_a_live_cache_is_not_shared(tiny_target):
    engine = Engine.from_pretrained(target=tiny_target, drafter="none", device="cpu", kv_cache="static")
    graphs = GraphedDecoder(engine.runner, capture=False)
    first, second = engine.runner.new_cache(300), engine.runner.new_cache(300)
    graphs._rehome(first, 1, 512)
    graphs._rehome(second, 1, 512)
    assert first.store.data_ptr() != second.store.data_ptr()  # first still holds the pooled one
    del first
    third = engine.runner.new_cache(300)
    graphs._rehome(third, 1, 512)
    assert third.store is graphs.stores[(1, 512)][0] and not third.store.any()  # free again, and zeroed
