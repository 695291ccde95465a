"""Batched verification: every sequence's greedy output equals decoding it alone."""
from __future__ import annotations

import pytest

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41], [11, 12, 13, 11, 12, 13, 11, 12, 13, 11, 12, 13, 14, 15],
           [1, 2, 3], [60, 61, 62, 63, 64, 60, 61], [7]]


@pytest.mark.parametrize("config", [dict(drafter="none"), dict(drafter="ngram", num_branches=2),
                                    dict(drafter="suffix", min_token_prob=0.0),
                                    dict(drafter="draft", tree_width=2, num_speculative_tokens=3)],
                         ids=lambda c: c["drafter"])
def test_batched_greedy_equals_alone(tiny_target, tiny_noisy_draft, config):
    engine = Engine.from_pretrained(target=tiny_target, draft=tiny_noisy_draft if config["drafter"] == "draft" else None,
                                    **config)
    lengths = [12, 30, 7, 25, 18, 3]  # sequences finish at different steps: the batch shrinks and refills
    alone = [engine.generate(p, SamplingParams(max_new_tokens=n, ignore_eos=True)).token_ids
             for p, n in zip(PROMPTS, lengths)]
    # Per-sequence max tokens through one params object is not possible, so compare prefixes of a long run.
    batched = generate_batch(engine, PROMPTS, SamplingParams(max_new_tokens=30, ignore_eos=True), max_batch=4)
    for want, got in zip(alone, batched):
        assert got[:len(want)] == want
        assert len(got) == 30


def test_kept_batch_cache_equals_stacking_afresh(tiny_target):
    """A BatchCache kept across steps (with trees, a changing batch and a lone step in between) leaves
    every sequence bitwise the same cache, tokens and versions as stacking the caches every step."""
    from specdec.batch_cache import BatchCache
    from specdec.step import verify_step
    from specdec.core.tree import DraftTree
    from specdec.sequence import Sequence

    engine = Engine.from_pretrained(target=tiny_target)
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)

    def fresh():
        return [Sequence(engine.runner, p, params) for p in PROMPTS[:4]]

    kept, afresh, pool = fresh(), fresh(), BatchCache(engine.runner)
    trees = [DraftTree.chain([5, 6]), DraftTree((7, 8, 9), (-1, -1, 0)), DraftTree.empty(), DraftTree.chain([1])]
    plan = [[0, 1, 2, 3]] * 3 + [[0, 1, 3]] * 2 + [[2]] + [[0, 1, 2, 3]] * 2  # shrink, a lone step, regrow
    for rows in plan:
        a = verify_step(engine.runner, [kept[i] for i in rows], [trees[i] for i in rows], pool)
        b = verify_step(engine.runner, [afresh[i] for i in rows], [trees[i] for i in rows], BatchCache(engine.runner))
        assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert_same_caches(pool, kept, afresh)


def test_a_failed_step_leaves_no_trace(tiny_target):
    """A step that fails after its forward and its (sampled) verdicts, just before the commit, leaves
    caches and generators as it found them: stepping again gives exactly the undisturbed run."""
    from specdec.batch_cache import BatchCache
    from specdec.core.tree import DraftTree
    from specdec.sequence import Sequence
    from specdec.step import verify_step

    engine = Engine.from_pretrained(target=tiny_target)
    params = SamplingParams(temperature=1.0, seed=7, max_new_tokens=20, ignore_eos=True)

    def run(fail_at: set[int]) -> list[int]:
        seq, pool = Sequence(engine.runner, PROMPTS[0], params), BatchCache(engine.runner)
        for n in range(6):
            tree = DraftTree.chain([5, 6, 7])
            if n in fail_at:
                def fault(_):
                    raise RuntimeError("injected")
                with pytest.raises(RuntimeError):
                    verify_step(engine.runner, [seq], [tree], pool, fault)
            verify_step(engine.runner, [seq], [tree], pool)
        return list(seq.generated_ids)

    assert run({1, 3}) == run(set())


def test_kept_rows_follow_a_changing_batch_bitwise(tiny_target):
    """Sequences keep their cache rows while the batch changes around them (parked when they sit a step
    out, copied in when they join, given back when no spare row is left, the store grown for a longer
    capacity): every step's tokens and every final cache are bitwise those of stacking afresh each step."""
    from specdec.batch_cache import BatchCache
    from specdec.core.tree import DraftTree
    from specdec.sequence import Sequence
    from specdec.step import verify_step

    engine = Engine.from_pretrained(target=tiny_target)
    budgets = [40, 30, 60, 45, 120, 50]  # capacities differ: a later joiner needs a larger store

    def fresh():
        return [Sequence(engine.runner, p, SamplingParams(max_new_tokens=n, ignore_eos=True))
                for p, n in zip(PROMPTS, budgets)]

    kept, afresh, pool = fresh(), fresh(), BatchCache(engine.runner)
    trees = [DraftTree.chain([5, 6]), DraftTree((7, 8, 9), (-1, -1, 0)), DraftTree.empty(), DraftTree.chain([1]),
             DraftTree.chain([3, 3, 3]), DraftTree((2, 4), (-1, -1))]
    plan = [[0, 1, 2], [0, 1, 2, 3], [3, 1], [2, 0, 3, 1], [1, 3], [0, 4, 2], [5, 4, 3, 2, 1, 0],
            [2], [0, 2, 5], [1, 3, 4], [4, 3, 2, 1, 0, 5]]
    for step, rows in enumerate(plan):
        a = verify_step(engine.runner, [kept[i] for i in rows], [trees[i] for i in rows], pool)
        b = verify_step(engine.runner, [afresh[i] for i in rows], [trees[i] for i in rows], BatchCache(engine.runner))
        assert [r.token_ids for r in a] == [r.token_ids for r in b], f"step {step}"
        if step == 2:  # 0 and 2 sat this step out in spare rows: parked, not given back
            assert kept[0].cache is None and kept[0].cache_lender is pool
            assert kept[2].cache is None and kept[2].cache_lender is pool
    assert_same_caches(pool, kept, afresh)


def test_kept_rows_served_greedy_equals_alone_across_joins(tiny_target):
    """In-process batching with more prompts than rows: sequences finish and join every few steps, and
    each output still equals decoding it alone (the kept rows never mix two sequences' entries)."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="ngram", num_branches=2)
    prompts = PROMPTS * 2
    alone = [engine.generate(p, SamplingParams(max_new_tokens=9 + 3 * i, ignore_eos=True)).token_ids
             for i, p in enumerate(prompts)]
    batched = generate_batch(engine, prompts, SamplingParams(max_new_tokens=9 + 3 * (len(prompts) - 1),
                                                             ignore_eos=True), max_batch=3)
    for want, got in zip(alone, batched):
        assert got[:len(want)] == want


def assert_same_caches(pool, kept: list, afresh: list) -> None:
    """Every sequence's own cache back (from the kept pool, and from the afresh ones' last pools): the same
    tokens, versions and bitwise the same keys and values."""
    import torch

    from specdec.core import kv

    pool.release()
    for seq in afresh:
        if seq.cache_lender is not None:
            seq.cache_lender.release()
    for x, y in zip(kept, afresh):
        assert x.context == y.context and x.version == y.version and x.cache_lender is None
        assert kv.num_cached(x.cache) == kv.num_cached(y.cache)
        for (kx, vx), (ky, vy) in zip(kv.entries(x.cache), kv.entries(y.cache)):
            assert torch.equal(kx, ky) and torch.equal(vx, vy)
