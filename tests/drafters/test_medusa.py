"""Medusa heads: checkpoint loading and shapes, tree proposals, greedy equality with plain decoding."""
from __future__ import annotations

import dataclasses
import re

import pytest
import torch

from distribution import assert_follows, exact_joint, target_next_probs
from specdec import Engine, SamplingParams
from specdec.core.tree import DraftTree
from specdec.drafters.medusa import MedusaHeads, load_medusa
from specdec.errors import InvalidArgument, ModelNotFound

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 43, 1, 2], [11, 12]]
GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("one_thread")


def test_heads_start_as_identity_and_keep_shapes():
    heads = MedusaHeads(num_heads=3, hidden_size=16)
    h = torch.randn(5, 16)
    out = heads(h)  # [n, K, H]
    assert out.shape == (5, 3, 16)
    assert torch.equal(out[:, 1], h)  # zero-initialised residual blocks


def test_checkpoint_loads_with_its_tree(tiny_medusa_dir):
    heads, vocab_ids, config = load_medusa(tiny_medusa_dir, torch.float32)
    assert config.num_heads == len(heads.blocks) == 4
    assert 1 <= len(config.tree_paths) <= 12
    assert all(len(p) == 1 or p[:-1] in config.tree_paths for p in config.tree_paths)  # prefix-closed
    assert vocab_ids.dtype == torch.int64 and vocab_ids.max() < config.target_vocab_size
    for name in ("loss.png", "recipe.json"):
        assert (tiny_medusa_dir / name).is_file()


def test_greedy_equals_plain_decoding(tiny_target, tiny_medusa_dir):
    plain = Engine.from_pretrained(target=tiny_target)
    medusa = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir))
    chain = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir), num_nodes=1,
                                   adaptive=False, num_speculative_tokens=2)
    for prompt in PROMPTS:
        want = plain.generate(prompt, GREEDY).token_ids
        for engine in (medusa, chain):
            out = engine.generate(prompt, GREEDY)
            assert out.token_ids == want
            assert out.stats.num_draft_tokens > 0


# The first token comes from the prefill; the heads draft from the second on. At this prompt and a
# flattened p the tiny heads' tokens have middling target probability, so accepting and rejecting
# them both matter (with T=1 they are near-certain or near-impossible and any rule looks right).
SAMPLED = SamplingParams(temperature=2.0, top_k=3, max_new_tokens=3, ignore_eos=True)
SAMPLED_PROMPT = [11, 12]
NUM_SAMPLED = 1200


def test_sampling_with_deterministic_children_follows_the_target(tiny_target, tiny_medusa_dir):
    """Medusa's children are the heads' top tokens (q one-hot): accepted with probability p(x), and a
    rejected x leaves the residual. The first two sampled tokens (fixed seeds) follow the target's exact
    joint distribution (G-test), with drafts both accepted and rejected on the way."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir), adaptive=False)
    outs = [engine.generate(SAMPLED_PROMPT, dataclasses.replace(SAMPLED, seed=seed)) for seed in range(NUM_SAMPLED)]
    accepted, drafted = sum(o.stats.num_accepted_tokens for o in outs), sum(o.stats.num_draft_tokens for o in outs)
    assert all(o.stats.num_draft_tokens > 0 for o in outs) and 0 < accepted < drafted
    exact = exact_joint(target_next_probs(tiny_target, SAMPLED), SAMPLED_PROMPT)
    assert_follows([tuple(o.token_ids[:2]) for o in outs], exact)


def test_proposal_is_a_valid_tree_bounded_by_depth(tiny_target, tiny_medusa_dir):
    engine = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir))
    session = engine.drafter.new_session()
    assert session.propose([1, 2, 3], 4, GREEDY, None) == DraftTree.empty()  # nothing attached yet

    class Seq:
        hidden = torch.randn(64)

    session.attach(Seq())
    tree = session.propose([1, 2, 3], 2, GREEDY, None)
    tree.validate(96, 64)
    assert 1 <= tree.num_nodes and all(p < i for i, p in enumerate(tree.parent_ids))
    # scored, so the policy sizes it: every node a probability, never above its parent's
    assert session.scores_nodes and tree.scores is not None and len(tree.scores) == tree.num_nodes
    assert all(0.0 <= s <= 1.0 for s in tree.scores)
    assert all(p < 0 or tree.scores[i] <= tree.scores[p] for i, p in enumerate(tree.parent_ids))


def test_tree_ranking_on_fresh_text_is_closed_and_ordered(tiny_features, tiny_medusa_dir):
    """medusa_tree ranks paths by how often they were right: every path after its prefix, the
    probabilities falling, a path's never above its prefix's (it is right only where the prefix is)."""
    from specdec.training.medusa_tree import rank_paths

    target, fs = tiny_features
    paths, probs, top1 = rank_paths(tiny_medusa_dir, fs, target.model.get_output_embeddings().weight, 20, 4)
    assert 1 <= len(paths) <= 20 and len(top1) == 4
    assert all(path[:-1] in paths[:i] for i, path in enumerate(paths) if len(path) > 1)
    assert all(a >= b for a, b in zip(probs, probs[1:]))
    where = dict(zip(paths, probs))
    assert all(where[path] <= where[path[:-1]] for path in paths if len(path) > 1)
    assert where.get((0,), 0.0) == pytest.approx(top1[0], abs=1e-6)  # path (0,): head 0's top-1, same positions


def test_tree_ranking_refuses_the_heads_own_training_text(tiny_medusa_dir, tmp_path, capsys):
    import json
    import shutil

    from specdec.training.medusa_tree import main, trained_seeds

    tiny_medusa_dir = shutil.copytree(tiny_medusa_dir, tmp_path / "medusa")  # the fixture is shared: a copy
    record = {"feature_shards": [{"seed": 3}], "result": {"sitting_history": [{"feature_seeds": [5, 6]}]},
              "init": {"init": {"feature_seeds": [9]}}}
    assert trained_seeds(record) == {3, 5, 6, 9}
    (tiny_medusa_dir / "recipe.json").write_text(json.dumps({**json.loads((tiny_medusa_dir / "recipe.json").read_text()),
                                                             "feature_shards": [{"seed": 41}]}))
    assert main(["--checkpoint", str(tiny_medusa_dir), "--seeds", "97,41"]) == 2
    assert "[41]" in capsys.readouterr().err
    assert main(["--checkpoint", str(tiny_medusa_dir / "missing")]) == 2
    # heads of the tiny target, ranked against the embedded SmolLM2 by default: refused before any shard is built
    assert main(["--checkpoint", str(tiny_medusa_dir), "--seeds", "97"]) == 2
    assert "pass its --target" in capsys.readouterr().err
    assert json.loads((tiny_medusa_dir / "medusa_config.json").read_text())["tree_paths"]  # left as it was


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_fused_heads_draft_what_the_heads_module_drafts(tiny_target, tiny_medusa_dir, dtype):
    """The drafter runs its K blocks as one packed product (only the heads its tree reaches) and builds
    each (depth, budget) tree shape once; tokens and scores must be those of the heads module, path by path."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir), dtype=dtype)
    drafter = engine.drafter
    assert drafter.fused is not None  # the tiny target runs on specdec's kernels too

    class Seq:
        hidden = torch.randn(64).to(drafter.head_weight.dtype)

    session = drafter.new_session()
    session.attach(Seq())
    feats = drafter.heads(Seq.hidden.unsqueeze(0))[0]  # [K, H]: every block on its own
    logits = drafter.lm_rows(feats)
    if drafter.top_kernel is not None:  # top_probs.cpp: a stable descending sort's first R (ties: lower index)
        top = torch.sort(logits.float(), dim=-1, descending=True, stable=True).indices[:, :drafter.max_rank + 1]
    else:
        top = torch.topk(logits, drafter.max_rank + 1, dim=-1).indices
    candidates = drafter.vocab_ids[top].tolist()
    probs = torch.softmax(logits.float(), dim=-1).gather(1, top).tolist()
    rel = 1e-5 if drafter.top_kernel is not None else 1e-9  # the kernel's exponential is not expf's bits
    for depth in (1, 2, 4):
        for budget in (None, 3):
            tree = session.draft(depth, budget)
            kept = []  # the first `budget` paths within depth whose parent path is kept
            for p in drafter.paths:
                if len(p) <= depth and (len(p) == 1 or p[:-1] in kept) and len(kept) != budget:
                    kept.append(p)
            ordered = sorted(kept, key=lambda p: (len(p), p))
            assert tree.token_ids == tuple(candidates[len(p) - 1][p[-1]] for p in ordered)
            expected = [float(torch.tensor([probs[h][r] for h, r in enumerate(p)], dtype=torch.float64).prod())
                        for p in ordered]
            assert tree.scores == pytest.approx(expected, rel=rel)


def test_wrong_target_and_missing_checkpoint_are_refused(tiny_target, tiny_medusa_dir, tmp_path):
    from specdec.drafters.trained import checkpoints_dir

    shipped = checkpoints_dir() / "medusa"  # trained for the embedded SmolLM2 (hidden 576, vocab 49152)
    with pytest.raises(InvalidArgument, match=re.escape(f"Medusa heads in {str(shipped)!r} were trained for another "
                                                        f"target (hidden 576, vocab 49152)")):
        Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(shipped))
    with pytest.raises(ModelNotFound, match=re.escape(f"{str(tmp_path)!r} holds no Medusa heads "
                                                      f"(medusa.safetensors + medusa_config.json)")):
        Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tmp_path))
    with pytest.raises(InvalidArgument, match="drafter 'medusa' takes no option width"):
        Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir), width=3)
    with pytest.raises(InvalidArgument, match="no trained medusa drafter is shipped for the target"):
        Engine.from_pretrained(target=tiny_target, drafter="medusa")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_heads_prepared_for_a_batch_draft_what_each_drafts_alone(tiny_target, tiny_medusa_dir, dtype):
    """A batch step runs every sequence's heads in one product (MedusaDrafter.prepare); each session's
    tree and scores must be exactly those it drafts alone, and a guess made for an older hidden state
    must not be used once the sequence has moved on."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir), dtype=dtype)
    drafter = engine.drafter
    torch.manual_seed(1)
    seqs = [type("Seq", (), {"hidden": torch.randn(64).to(drafter.head_weight.dtype)})() for _ in range(5)]
    alone, together = [], []
    for seq in seqs:
        session = drafter.new_session()
        session.attach(seq)
        alone.append(session.draft(4, None))
        together.append(session)
    drafter.prepare([(s, 4 if i % 2 else 2, None) for i, s in enumerate(together)])
    assert all(s.ready is not None for s in together)
    for session, expected in zip(together, alone):
        tree = session.draft(4, None)  # deeper than some were prepared for: drafted afresh
        assert tree.token_ids == expected.token_ids and tree.scores == expected.scores
        assert session.ready is None  # used once
    session = together[0]
    drafter.prepare([(session, 4, None), (together[1], 4, None)])
    stale = session.ready
    session.sequence.hidden = torch.randn(64).to(drafter.head_weight.dtype)  # the next step's state
    fresh = drafter.new_session()
    fresh.attach(session.sequence)
    assert session.draft(4, None) == fresh.draft(4, None)
    assert stale.hidden is not session.sequence.hidden


@pytest.mark.parametrize("broken", [False, True], ids=["prepared", "prepare-fails"])
def test_batched_medusa_greedy_equals_alone(tiny_target, tiny_medusa_dir, broken, monkeypatch):
    """In a batch the heads run for every sequence at once (specdec.step.prepare_together); greedy output
    must equal decoding each prompt alone, and a failing batch product must only make each draft alone."""
    from specdec.batch import generate_batch
    from specdec.drafters.medusa import MedusaDrafter

    engine = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir))
    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41], [11, 12, 13, 11, 12, 13, 14], [1, 2, 3]]
    params = SamplingParams(max_new_tokens=20, ignore_eos=True)
    alone = [engine.generate(p, params).token_ids for p in prompts]
    calls = []
    real = MedusaDrafter.prepare

    def prepare(self, sessions):
        calls.append(len(sessions))
        if broken:
            raise RuntimeError("injected")
        return real(self, sessions)

    monkeypatch.setattr(MedusaDrafter, "prepare", prepare)
    assert generate_batch(engine, prompts, params, max_batch=4, load_aware=False) == alone
    assert calls and max(calls) == 4


def test_heads_run_in_bf16_beside_a_float32_target_where_the_cpu_multiplies_bf16(tiny_target, tiny_medusa_dir):
    """As EAGLE's head: where the CPU has AVX512-BF16, the heads and their rows of the LM head stream half
    the bytes beside a float32 target (drafts need no float32 exactness), and greedy output still equals
    plain decoding's; elsewhere they keep the target's dtype (specdec.drafters.trained.draft_dtype)."""
    from specdec.kernels.build import load_kernel

    engine = Engine.from_pretrained(target=tiny_target, drafter="medusa", draft=str(tiny_medusa_dir))
    want = torch.bfloat16 if load_kernel().native_bf16 else torch.float32
    drafter = engine.drafter
    assert engine.runner.dtype == torch.float32
    assert drafter.head_weight.dtype == want and next(drafter.heads.parameters()).dtype == want
    plain = Engine.from_pretrained(target=tiny_target)
    for prompt in PROMPTS:
        assert engine.generate(prompt, GREEDY).token_ids == plain.generate(prompt, GREEDY).token_ids


@pytest.mark.parametrize("drafter", ["medusa", "hybrid"])
def test_heads_run_on_the_kernel_the_engine_was_given(tiny_target, tiny_medusa_dir, drafter):
    """linear_kernel reaches the heads as it reaches the target: building the drafter once installed the default
    kernel into the target's model and ran the heads on it whatever the engine was asked for."""
    from specdec.kernels.linear import PackedLinear

    engine = Engine.from_pretrained(target=tiny_target, drafter=drafter, draft=str(tiny_medusa_dir),
                                    linear_kernel="torch")
    medusa = engine.drafter.medusa if drafter == "hybrid" else engine.drafter
    assert engine.runner.linear_kernel.kernel == "torch"
    assert medusa.fused is None and not isinstance(medusa.lm_rows, PackedLinear)
    assert not any(isinstance(m, PackedLinear) for m in medusa.heads.modules())
    assert not any(isinstance(m, PackedLinear) for m in engine.runner.model.modules())
    plain = Engine.from_pretrained(target=tiny_target, linear_kernel="torch")
    for prompt in PROMPTS:
        assert engine.generate(prompt, GREEDY).token_ids == plain.generate(prompt, GREEDY).token_ids
