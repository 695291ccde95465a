"""EAGLE-3-style head: fused features captured in the verify forward, TTT = drafting, lossless greedy and sampling."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from distribution import assert_follows, exact_joint, target_next_probs
from drafters.conftest import assert_greedy_like_plain
from specdec import Engine, SamplingParams
from specdec.drafters.eagle_layer import load_eagle
from specdec.errors import InvalidArgument
from specdec.training.ttt import ttt_outputs

pytestmark = pytest.mark.usefixtures("one_thread")


def test_runner_captures_the_fused_layers_of_its_forward(tiny_deep_target, tiny_eagle3_dir):
    engine = Engine.from_pretrained(target=tiny_deep_target, drafter="eagle3", draft=str(tiny_eagle3_dir))
    runner = engine.runner
    assert runner.feature_layers == (1, 2, 3) and engine.drafter.name == "eagle3"
    ids = [3, 4, 5, 6, 7]
    _, hidden = runner.forward(ids, runner.new_cache())
    with torch.inference_mode():
        want = engine.target.model(torch.tensor([ids]), output_hidden_states=True).hidden_states
    fused = runner.features(hidden)  # [n, 3H]
    assert fused.shape == (5, 3 * 64)
    torch.testing.assert_close(fused, torch.cat([want[k][0] for k in (1, 2, 3)], -1), rtol=1e-4, atol=1e-4)


def test_training_time_test_unrolls_exactly_as_drafting(tiny_fused, tiny_eagle3_dir):
    """Step j of the TTT unroll at position p must equal drafting a chain of j nodes from the root pair
    p - j with the head's KV cache (what EagleSession does): same inputs, same attention."""
    _, fs = tiny_fused
    head, _ = load_eagle(tiny_eagle3_dir, torch.float32)
    a, b = int(fs.cu_seqlens[0]), int(fs.cu_seqlens[1])
    feats, toks = fs.features[a:b - 1].float(), fs.ids[a + 1:b]
    embed = torch.randn(200, 64)  # any embedding table: both paths read the same rows
    outs = ttt_outputs(head, feats[None], embed[toks][None], 4)
    root = 5
    out, past = head(feats[None, :root + 1], embed[toks[:root + 1]][None], torch.arange(root + 1))
    prev = out[0, -1]
    for step in range(1, 4):
        p = root + step
        # the cache holds the context up to the root and this chain: a node attends to all of it
        out, past = head(prev[None, None], embed[toks[p:p + 1]][None], torch.tensor([p]), past)
        prev = out[0, -1]
        torch.testing.assert_close(prev, outs[step][0, p], rtol=1e-4, atol=1e-4)


def test_greedy_equals_plain_decoding(tiny_deep_target, tiny_eagle3_dir):
    assert_greedy_like_plain(tiny_deep_target, "eagle3", tiny_eagle3_dir, must_accept=True)


def test_sampling_keeps_the_target_distribution(tiny_deep_target, tiny_eagle3_dir):
    """First two sampled tokens vs the exact joint p(x1) p(x2 | x1) (G-test, tests/distribution.py)."""
    params = SamplingParams(temperature=1.0, top_k=12, max_new_tokens=4, ignore_eos=True)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    engine = Engine.from_pretrained(target=tiny_deep_target, drafter="eagle3", draft=str(tiny_eagle3_dir),
                                    adaptive=False, num_speculative_tokens=3, top_k=3, depth=3, num_nodes=8)
    outs = [engine.generate(prompt, dataclasses.replace(params, seed=seed)) for seed in range(1000)]
    drafted = sum(o.stats.num_draft_tokens for o in outs)
    accepted = sum(o.stats.num_accepted_tokens for o in outs)
    assert 0 < accepted < drafted
    assert_follows([tuple(o.token_ids[:2]) for o in outs], exact_joint(target_next_probs(tiny_deep_target, params),
                                                                       prompt))


def test_heads_are_not_interchangeable(tiny_deep_target, tiny_eagle3_dir):
    with pytest.raises(InvalidArgument, match="eagle3 head"):
        Engine.from_pretrained(target=tiny_deep_target, drafter="eagle", draft=str(tiny_eagle3_dir))
