"""The preallocated KV cache decodes exactly as transformers' DynamicCache: token for token, in process
and batched, plain and speculative (chains and trees), and its bookkeeping (growth, crop, a forward
that dies halfway) never shows a stale entry."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.core import kv
from specdec.errors import InvalidArgument
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner, RunnerConfig
from specdec.models.static_cache import StaticKVCache

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41], [11, 12, 13, 11, 12, 13, 11, 12, 13, 14], [7]]
CONFIGS = [dict(drafter="none"), dict(drafter="ngram", num_branches=2),
           dict(drafter="draft", tree_width=2, num_speculative_tokens=3)]


def engines(tiny_target, tiny_noisy_draft, config) -> dict[str, Engine]:
    """Fixed depth (adaptive=False): the depth the policy picks from timings would differ run to run."""
    draft = tiny_noisy_draft if config["drafter"] == "draft" else None
    return {kind: Engine.from_pretrained(target=tiny_target, draft=draft, kv_cache=kind, adaptive=False, **config)
            for kind in ("static", "dynamic")}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c["drafter"])
def test_static_equals_dynamic_in_process(tiny_target, tiny_noisy_draft, config):
    by_kind = engines(tiny_target, tiny_noisy_draft, config)
    assert isinstance(by_kind["static"].runner.new_cache(), StaticKVCache)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    for prompt in PROMPTS:
        static = by_kind["static"].generate(prompt, params)
        dynamic = by_kind["dynamic"].generate(prompt, params)
        assert static.token_ids == dynamic.token_ids
        if config["drafter"] != "none":  # the speculative path really ran: trees verified and accepted
            assert static.stats.num_draft_tokens > 0
        assert static.stats.num_accepted_tokens == dynamic.stats.num_accepted_tokens


@pytest.mark.parametrize("config", CONFIGS[1:], ids=lambda c: c["drafter"])
def test_static_equals_dynamic_batched(tiny_target, tiny_noisy_draft, config):
    by_kind = engines(tiny_target, tiny_noisy_draft, config)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    runs = {kind: generate_batch(engine, PROMPTS * 2, params, max_batch=3) for kind, engine in by_kind.items()}
    assert runs["static"] == runs["dynamic"]
    alone = [by_kind["dynamic"].generate(p, params).token_ids for p in PROMPTS]
    assert runs["static"] == alone * 2


def test_sampled_static_equals_dynamic(tiny_target, tiny_noisy_draft):
    """Same seed, same draws: the logits the verifier sees agree, so sampled tokens agree too."""
    by_kind = engines(tiny_target, tiny_noisy_draft, dict(drafter="draft", tree_width=2, num_speculative_tokens=3))
    params = SamplingParams(temperature=1.0, seed=11, max_new_tokens=30, ignore_eos=True)
    assert by_kind["static"].generate(PROMPTS[0], params).token_ids == \
        by_kind["dynamic"].generate(PROMPTS[0], params).token_ids


def test_growth_crop_and_a_half_done_forward(tiny_target):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(kv_cache="static"))
    reference = ModelRunner(runner.model, config=RunnerConfig(kv_cache="dynamic"))
    cache, ref = runner.new_cache(capacity=3), reference.new_cache()  # too small: grows by doubling
    store_before = None
    for chunk in ([1, 2], [3, 4, 5], [6], [7, 8, 9, 10, 11]):
        got, _ = runner.forward(chunk, cache)
        want, _ = reference.forward(chunk, ref)
        assert torch.equal(got, want)
        store_before = cache.store if store_before is None else store_before
    assert kv.num_cached(cache) == 11 and cache.capacity == 12 and cache.store is not store_before
    kv.crop(cache, 4)
    kv.crop(ref, 4)
    assert kv.num_cached(cache) == 4
    # a forward that dies after its first layer wrote: the length stays, the next forward overwrites
    keys, values = kv.entries(cache)[0]
    with torch.inference_mode():
        cache.update(keys[:, :, :2] + 1.0, values[:, :, :2] + 1.0, 0)
    assert kv.num_cached(cache) == 4
    got, _ = runner.forward([42, 43], cache)
    want, _ = reference.forward([42, 43], ref)
    assert torch.equal(got, want)
    for (k, v), (k_ref, v_ref) in zip(kv.entries(cache), kv.entries(ref)):
        assert torch.equal(k, k_ref) and torch.equal(v, v_ref)


def test_unknown_kind_is_refused_before_loading():
    with pytest.raises(InvalidArgument, match="kv_cache must be one of static, dynamic; got 'paged'"):
        Engine.from_pretrained(target="/no/such/dir", kv_cache="paged")
