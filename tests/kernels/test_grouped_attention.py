"""Grouped-query attention without repeated keys (specdec.kernels.grouped): the same numbers as
transformers' sdpa with repeat_kv, and the same greedy tokens through the engine (forced on here: on a
CPU it is otherwise chosen only on CUDA devices)."""
from __future__ import annotations

import pytest
import torch
from transformers.integrations.sdpa_attention import sdpa_attention_forward

from specdec import Engine, SamplingParams
from specdec.kernels import attention, grouped

pytestmark = pytest.mark.usefixtures("one_thread")


class Layer(torch.nn.Module):  # what transformers' attention functions read off a module
    def __init__(self, groups: int):
        super().__init__()
        self.num_key_value_groups = groups
        self.is_causal = True


def tree_mask(batch: int, rows: int, cached: int, dtype=torch.float32, seed: int = 0) -> torch.Tensor:
    """[B, 1, n, cached + n]: every row sees the cache and a random subset of earlier rows plus itself."""
    gen = torch.Generator().manual_seed(seed)
    sees = torch.rand(batch, 1, rows, rows, generator=gen) < 0.5
    sees = (sees.tril(-1) | torch.eye(rows, dtype=torch.bool))
    full = torch.cat([torch.ones(batch, 1, rows, cached, dtype=torch.bool), sees], dim=-1)
    return torch.zeros(full.shape, dtype=dtype).masked_fill(~full, torch.finfo(dtype).min)


@pytest.mark.parametrize("rows", [1, 2, 5, 16])
@pytest.mark.parametrize("boolean", [False, True])
def test_matches_sdpa_with_repeated_keys(rows, boolean):
    batch, heads, kv_heads, cached, dim = 3, 8, 2, 11, 16
    gen = torch.Generator().manual_seed(rows)
    query = torch.randn(batch, rows, heads, dim, generator=gen).transpose(1, 2)  # as a layer makes it: strided
    key, value = (torch.randn(batch, kv_heads, cached + rows, dim, generator=gen) for _ in range(2))
    mask = tree_mask(batch, rows, cached)
    if boolean:
        mask = mask == 0
    layer = Layer(heads // kv_heads)
    want, _ = sdpa_attention_forward(layer, query, key, value, mask, scaling=dim ** -0.5)
    got, _ = grouped.grouped_attention(layer, query, key, value, mask, scaling=dim ** -0.5)
    assert got.shape == (batch, rows, heads, dim) and got.is_contiguous()
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    # a head sees its own kv head: swapping kv heads must change the rows of the heads that use them
    swapped, _ = grouped.grouped_attention(layer, query, key.flip(1), value.flip(1), mask, scaling=dim ** -0.5)
    assert not torch.allclose(swapped, got)


def test_chosen_only_on_cuda_with_grouped_heads(tiny_target):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_target)
    assert model.config.num_key_value_heads < model.config.num_attention_heads
    assert not grouped.wanted(model)  # on a CPU
    assert not attention.install(model, on=False) and model.config._attn_implementation == "sdpa"


@pytest.mark.parametrize("config", [dict(drafter="ngram", num_branches=2),
                                    dict(drafter="draft", tree_width=2, num_speculative_tokens=3)],
                         ids=lambda c: c["drafter"])
def test_engine_tokens_equal_plain(tiny_target, tiny_noisy_draft, monkeypatch, config):
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [11, 12, 13, 11, 12, 13, 11, 12, 13, 14]]
    plain = Engine.from_pretrained(target=tiny_target, device="cpu", adaptive=False, drafter="none",
                                   linear_kernel="torch")
    want = [plain.generate(p, params).token_ids for p in prompts]
    monkeypatch.setattr(grouped, "wanted", lambda model: True)
    draft = tiny_noisy_draft if config["drafter"] == "draft" else None
    engine = Engine.from_pretrained(target=tiny_target, draft=draft, device="cpu", adaptive=False,
                                    linear_kernel="torch", **config)
    assert engine.runner.model.config._attn_implementation == grouped.NAME
    outs = [engine.generate(p, params) for p in prompts]
    assert [o.token_ids for o in outs] == want
    assert sum(o.stats.num_accepted_tokens for o in outs) > 0  # multi-row verify forwards ran and accepted


def test_what_it_does_not_cover_goes_to_sdpa_as_it_is():
    layer, mask = Layer(4), tree_mask(1, 3, 5)
    query, key, value = torch.randn(1, 8, 3, 16), torch.randn(1, 2, 8, 16), torch.randn(1, 2, 8, 16)
    with pytest.raises(ValueError, match="softcap"):  # sdpa refuses soft-capping; it is never silently dropped
        grouped.grouped_attention(layer, query, key, value, mask, softcap=30.0)
