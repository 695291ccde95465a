"""EAGLE-style head: the cached, tree-attention drafting matches a from-scratch recompute; greedy equality."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from drafters.conftest import assert_greedy_like_plain
from specdec import Engine, InvalidArgument, SamplingParams
from specdec.drafters.eagle import rerank
from specdec.drafters.eagle_layer import load_eagle

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 43, 1, 2], [11, 12]]
GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("one_thread")


def test_checkpoint_loads(tiny_eagle_dir):
    head, vocab_ids = load_eagle(tiny_eagle_dir, torch.float32)
    assert head.c.hidden_size == 64 and head.c.top_k == 3
    out, (k, v) = head(torch.randn(1, 5, 64), torch.randn(1, 5, 64), torch.arange(5))
    assert out.shape == (1, 5, 64) and k.shape == (1, head.c.num_kv_heads, 5, head.c.head_dim)
    assert (tiny_eagle_dir / "loss.png").is_file()


def test_greedy_equals_plain_decoding(tiny_target, tiny_eagle_dir):
    assert_greedy_like_plain(tiny_target, "eagle", tiny_eagle_dir)


def test_chain_matches_recompute_without_cache(tiny_target, tiny_eagle_dir):
    """top_k = 1: the drafted chain must equal feeding (feature, token) pairs from scratch each time,
    which checks the head's own KV cache, its positions and the tree mask."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="eagle", draft=str(tiny_eagle_dir), top_k=1,
                                    depth=4, num_nodes=4, adaptive=False, num_speculative_tokens=4)
    d = engine.drafter
    prompt = PROMPTS[0]
    steps = list(engine.stream(prompt, GREEDY))  # warm the sequence through a few verify steps
    assert steps
    from specdec.sequence import Sequence

    from specdec.batch_cache import BatchCache
    from specdec.step import verify_step

    seq = Sequence(engine.runner, prompt, GREEDY, keep_features=True)
    pool = BatchCache(engine.runner)
    session = d.new_session()
    session.attach(seq)
    for _ in range(3):
        tree = session.propose(seq.context, 4, GREEDY, None)
        assert tree.parent_ids == (-1, 0, 1, 2)
        feats = torch.cat(seq.feature_chunks)  # [n - 1, H]
        ctx = list(seq.context)
        pair_feats, pair_toks, want = list(feats), ctx[1:], []
        for _ in range(4):
            out, _ = d.head(torch.stack(pair_feats)[None], d.embed(pair_toks)[None], torch.arange(len(pair_toks)))
            token = int(d.vocab_ids[d.draft_logits(out[0, -1:]).argmax()])
            want.append(token)
            pair_feats.append(out[0, -1])
            pair_toks.append(token)
        assert list(tree.token_ids) == want
        verify_step(engine.runner, [seq], [tree], pool)


def test_rerank_keeps_parents_and_budget():
    tokens, parents = [10, 11, 12, 13, 14], [-1, -1, 0, 2, 1]
    scores, levels = [-0.1, -2.0, -0.3, -0.5, -2.1], [1, 1, 2, 3, 2]
    tree = rerank(tokens, parents, scores, levels, 3)
    assert tree.token_ids == (10, 12, 13) and tree.parent_ids == (-1, 0, 1)
    assert tree.scores == pytest.approx((math.exp(-0.1), math.exp(-0.3), math.exp(-0.5)))


def _session_after_prefill(engine, prompt):
    """A drafting session attached to a sequence whose prompt the target has just read."""
    from specdec.sequence import Sequence

    seq = Sequence(engine.runner, prompt, GREEDY, keep_features=True)
    session = engine.drafter.new_session()
    session.attach(seq)
    return seq, session


def test_nodes_carry_their_paths_draft_probability(tiny_target, tiny_eagle_dir):
    """Scores are products of the head's own probabilities along each path: in (0, 1], never above the
    parent's, and a root child's is its softmax probability, which the policy sizes the tree by."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="eagle", draft=str(tiny_eagle_dir), top_k=3,
                                    depth=3, num_nodes=12, adaptive=False, num_speculative_tokens=3)
    seq, session = _session_after_prefill(engine, PROMPTS[0])
    tree = session.propose(seq.context, 3, GREEDY, None)
    assert tree.num_nodes == 12 and tree.scores is not None and len(tree.scores) == 12
    for node, (parent, score) in enumerate(zip(tree.parent_ids, tree.scores)):
        assert 0.0 < score <= 1.0
        assert parent < 0 or score <= tree.scores[parent] + 1e-12, node
    d = engine.drafter
    root_probs = torch.softmax(d.draft_logits(session.root_out[None]).float(), dim=-1)[0]  # [V']
    for node, parent in enumerate(tree.parent_ids):
        if parent < 0:
            index = d.vocab_list.index(tree.token_ids[node])
            assert tree.scores[node] == pytest.approx(float(root_probs[index]), rel=1e-4)


def test_drafting_stops_once_no_path_is_likely_enough(tiny_target, tiny_eagle_dir):
    """With the head's distribution flat over V' tokens, a path at level L has probability V'^-L: a bar
    just below 1/V' lets level 1 expand once (depth 2), one above it stops at the root's children, and 0
    drafts the full depth."""
    def depth_of(tree):
        levels = []
        for parent in tree.parent_ids:
            levels.append(1 if parent < 0 else levels[parent] + 1)
        return max(levels)

    depths = {}
    for bar in (0.0, 0.5, 2.0):  # in units of 1/V'
        engine = Engine.from_pretrained(target=tiny_target, drafter="eagle", draft=str(tiny_eagle_dir), top_k=3,
                                        depth=4, num_nodes=30, adaptive=False, num_speculative_tokens=4)
        d = engine.drafter
        num_vocab = len(d.vocab_list)
        d.config = replace(d.config, min_path_prob=bar / num_vocab)
        d.draft_logits = lambda feats: torch.zeros(feats.shape[0], num_vocab)  # flat: every token 1/V'
        seq, session = _session_after_prefill(engine, PROMPTS[1])
        tree = session.propose(seq.context, 4, GREEDY, None)
        assert max(tree.scores) == pytest.approx(1 / num_vocab)
        depths[bar] = depth_of(tree)
    assert depths == {0.0: 4, 0.5: 2, 2.0: 1}


@pytest.mark.parametrize("bad", [-0.1, 1.0, 2.0])
def test_min_path_prob_outside_0_1_is_refused(tiny_target, tiny_eagle_dir, bad):
    with pytest.raises(InvalidArgument, match="min_path_prob"):
        Engine.from_pretrained(target=tiny_target, drafter="eagle", draft=str(tiny_eagle_dir), min_path_prob=bad)


def test_head_runs_in_bf16_beside_a_float32_target_where_the_cpu_multiplies_bf16(tiny_target, tiny_eagle_dir):
    """Drafts need no float32 exactness (verification decides every token): where the CPU has AVX512-BF16
    the head streams half the bytes, and greedy output still equals plain decoding's."""
    from specdec.kernels.build import load_kernel

    engine = Engine.from_pretrained(target=tiny_target, drafter="eagle", draft=str(tiny_eagle_dir))
    want = torch.bfloat16 if load_kernel().native_bf16 else torch.float32
    assert engine.runner.dtype == torch.float32 and engine.drafter.dtype == want
    assert next(engine.drafter.head.parameters()).dtype == want
    plain = Engine.from_pretrained(target=tiny_target)
    for prompt in PROMPTS:
        assert engine.generate(prompt, GREEDY).token_ids == plain.generate(prompt, GREEDY).token_ids
