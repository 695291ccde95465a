"""Sampled output keeps the target's distribution when the speculation policy cuts trees.

The policy is forced deterministically (costs given, not measured): the first step's budget is 5
nodes and by the costs 3 nodes pay, so drafters are told 5 nodes (a width-2 tree of depth 3 would
have 10), deterministic trees (EAGLE) are then cut to 3 by likelihood, and sampled trees keep the
prefix planned before drafting. First two emitted tokens vs the exact joint p(x1) p(x2 | x1), G-test
as in tests/core/test_verify_lossless.py (which shows broken samplers failing it); the exact
enumeration in tests/core/test_cut_exact.py covers what random tiny models may hide.
"""
from __future__ import annotations

import dataclasses

import pytest

from distribution import assert_follows, exact_joint, target_next_probs
from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.policy import PolicyConfig
from specdec.policy.budget import BudgetConfig

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
NUM_DRAWS = 1000
FORCED = PolicyConfig(max_depth=3, adaptive=False, load_aware=True, budget=BudgetConfig(
    costs=((1, 1.0), (4, 1.0), (5, 100.0)), learn_costs=False, first_budget=5, min_probe_interval=1 << 20))
PARAMS = SamplingParams(temperature=1.0, top_k=12, max_new_tokens=4, ignore_eos=True)


def forced(engine: Engine) -> Engine:
    engine.config = dataclasses.replace(engine.config, policy=FORCED)
    return engine


def check(target: str, outputs: list[list[int]], drafted: int, accepted: int) -> None:
    assert 0 < accepted < drafted  # drafts were accepted, and rejected, along the way
    assert_follows([tuple(ids[:2]) for ids in outputs], exact_joint(target_next_probs(target, PARAMS), PROMPT))


@pytest.mark.parametrize("width", [2, 3])
def test_draft_model_trees_cut_to_the_budget(tiny_target, tiny_noisy_draft, width):
    engine = forced(Engine.from_pretrained(target=tiny_target, drafter="draft", draft=tiny_noisy_draft,
                                           num_speculative_tokens=3, tree_width=width))
    outs = [engine.generate(PROMPT, dataclasses.replace(PARAMS, seed=seed)) for seed in range(NUM_DRAWS)]
    assert max(o.stats.num_draft_tokens for o in outs) <= 5 + 4 * 3  # 5 nodes, then the chosen 3 + 1
    check(tiny_target, [o.token_ids for o in outs], sum(o.stats.num_draft_tokens for o in outs),
          sum(o.stats.num_accepted_tokens for o in outs))


def test_eagle_dynamic_tree_cut_by_likelihood(tiny_target, tiny_eagle_dir, monkeypatch):
    """The tree without its scores, so the chain model orders its nodes: the tiny head's own scores are
    confidently wrong on PROMPT (its top guesses score 1.0 and are never drawn), the calibrated policy soon
    stops drafting, and the G-test would have no accepted draft to check. EAGLE's scored trees under
    sampling are G-tested in tests/drafters/test_eagle3.py."""
    from specdec.drafters.eagle import EagleSession

    propose = EagleSession.propose
    monkeypatch.setattr(EagleSession, "scores_nodes", False)
    monkeypatch.setattr(EagleSession, "propose", lambda self, *a, **k: dataclasses.replace(propose(self, *a, **k),
                                                                                            scores=None))
    engine = forced(Engine.from_pretrained(target=tiny_target, drafter="eagle", draft=str(tiny_eagle_dir),
                                           num_speculative_tokens=3, top_k=3, depth=3, num_nodes=12))
    outs = [engine.generate(PROMPT, dataclasses.replace(PARAMS, seed=seed)) for seed in range(NUM_DRAWS)]
    assert max(o.stats.num_draft_tokens for o in outs) <= 3 * 4  # cut to 3 nodes a step, 4 steps at most
    check(tiny_target, [o.token_ids for o in outs], sum(o.stats.num_draft_tokens for o in outs),
          sum(o.stats.num_accepted_tokens for o in outs))


def test_batched_draft_trees_cut_to_the_budget(tiny_target, tiny_noisy_draft):
    engine = forced(Engine.from_pretrained(target=tiny_target, drafter="draft", draft=tiny_noisy_draft,
                                           num_speculative_tokens=3, tree_width=2))
    steps: list = []
    outputs = generate_batch(engine, [PROMPT] * NUM_DRAWS, PARAMS, max_batch=6, steps=steps)  # unseeded draws
    assert max(s.num_drafted for s in steps) == 5  # the first step's budget; a full tree would have 10 nodes
    check(tiny_target, outputs, sum(s.num_drafted for s in steps), sum(s.num_accepted for s in steps))
