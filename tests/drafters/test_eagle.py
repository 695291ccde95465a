"""EAGLE-style head: the cached, tree-attention drafting matches a from-scratch recompute; greedy equality."""
from __future__ import annotations

import pytest
import torch

from drafters.conftest import assert_greedy_like_plain
from specdec import Engine, SamplingParams
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
            token = int(d.vocab_ids[(out[0, -1] @ d.head_weight.T).argmax()])
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
