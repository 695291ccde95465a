"""The hybrid drafter (suffix decoding + Medusa heads): the merge and the choice on hand-made trees,
the fallback when a sub-drafter samples, greedy equality with plain decoding (alone and batched), exact
sampling (G-test), and every entry point accepting it."""
from __future__ import annotations

import dataclasses

import pytest
import torch

from distribution import assert_follows, exact_joint, target_next_probs
from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.core.tree import DraftTree
from specdec.drafters.hybrid import HybridConfig, HybridSession, choose_tree, merge_trees
from specdec.errors import InvalidArgument

PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6], [40, 41, 42, 43, 1, 2], [11, 12]]
GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("one_thread")

# suffix: 10 -> 11 -> 12, and 20 beside 10;  medusa: 10 -> 11 -> 13, and 30 beside 10
SUFFIX = DraftTree((10, 11, 20, 12), (-1, 0, -1, 1), scores=(0.9, 0.8, 0.1, 0.7))
MEDUSA = DraftTree((10, 30, 11, 13), (-1, -1, 0, 2), scores=(0.95, 0.2, 0.85, 0.3))


def _paths(tree: DraftTree) -> dict[tuple[int, ...], float]:
    """{token path from the root: score}: the tree as a set, whatever its node order."""
    out = {}
    for i in range(tree.num_nodes):
        path, node = [], i
        while node != -1:
            path.append(tree.token_ids[node])
            node = tree.parent_ids[node]
        out[tuple(reversed(path))] = tree.scores[i]
    return out


def test_union_merges_shared_paths_and_keeps_the_larger_score():
    merged = merge_trees(SUFFIX, MEDUSA)
    assert merged.q is None and all(-1 <= p < i for i, p in enumerate(merged.parent_ids))
    assert _paths(merged) == {(10,): 0.95, (10, 11): 0.85, (20,): 0.1, (10, 11, 12): 0.7, (30,): 0.2,
                              (10, 11, 13): 0.3}
    assert merged.token_ids[:4] == SUFFIX.token_ids  # the first tree's nodes keep their places
    merged.validate(vocab_size=64, max_nodes=6)
    for tree in (SUFFIX, MEDUSA):  # merging with an empty tree changes nothing
        assert _paths(merge_trees(tree, DraftTree((), (), scores=()))) == _paths(tree)


def test_union_over_budget_keeps_the_most_probable_closed_subtree():
    cut = merge_trees(SUFFIX, MEDUSA, max_nodes=4)
    assert _paths(cut) == {(10,): 0.95, (10, 11): 0.85, (10, 11, 12): 0.7, (10, 11, 13): 0.3}
    assert all(-1 <= p < i for i, p in enumerate(cut.parent_ids))
    assert merge_trees(SUFFIX, MEDUSA, max_nodes=0).num_nodes == 0


def test_union_refuses_sampled_or_unscored_trees():
    sampled = DraftTree((10,), (-1,), q=torch.ones(1, 64) / 64, scores=(0.5,))
    with pytest.raises(InvalidArgument, match="deterministic"):
        merge_trees(SUFFIX, sampled)
    with pytest.raises(InvalidArgument, match="scored"):
        merge_trees(SUFFIX, DraftTree.chain([10, 11]))


def test_choice_follows_the_suffix_trees_expected_tokens():
    assert choose_tree(SUFFIX, MEDUSA, threshold=2.5) is SUFFIX  # 0.9 + 0.8 + 0.1 + 0.7 = 2.5
    assert choose_tree(SUFFIX, MEDUSA, threshold=2.6) is MEDUSA
    empty = DraftTree((), (), scores=())
    assert choose_tree(empty, MEDUSA, threshold=0.0) is MEDUSA  # an empty suffix tree never wins
    assert choose_tree(SUFFIX, empty, threshold=9.0) is SUFFIX  # nor an empty Medusa tree


class _Fixed:
    """A stand-in sub-session proposing one fixed tree."""

    def __init__(self, tree: DraftTree):
        self.tree = tree

    def propose(self, context_ids, max_tokens, params, generator, max_nodes=None) -> DraftTree:
        return self.tree


def _session(suffix: DraftTree, medusa: DraftTree, mode: str = "union") -> HybridSession:
    session = HybridSession.__new__(HybridSession)
    session.config, session.suffix, session.medusa = HybridConfig(mode=mode), _Fixed(suffix), _Fixed(medusa)
    return session


@pytest.mark.parametrize("mode", ["union", "choose"])
def test_a_sampled_sub_tree_is_never_merged(mode):
    """Were a sub-drafter to sample (q rows), the step keeps one drafter's tree whole: the other
    (deterministic) one where there is one, else the suffix tree as drawn."""
    q = torch.full((1, 64), 1 / 64)
    sampled_suffix = DraftTree((10,), (-1,), q=q)
    sampled_medusa = DraftTree((30,), (-1,), q=q)
    propose = lambda s: s.propose([1, 2], 4, GREEDY, None)  # noqa: E731
    assert propose(_session(SUFFIX, sampled_medusa, mode)) is SUFFIX
    assert propose(_session(sampled_suffix, MEDUSA, mode)) is sampled_suffix
    assert propose(_session(sampled_suffix, sampled_medusa, mode)) is sampled_suffix
    assert _paths(propose(_session(SUFFIX, MEDUSA, "union"))) == _paths(merge_trees(SUFFIX, MEDUSA))


@pytest.mark.parametrize("options", [dict(mode="union"), dict(mode="choose")], ids=["union", "choose"])
def test_greedy_equals_plain_decoding_alone_and_batched(tiny_target, tiny_medusa_dir, options):
    plain = Engine.from_pretrained(target=tiny_target)
    hybrid = Engine.from_pretrained(target=tiny_target, drafter="hybrid", draft=str(tiny_medusa_dir),
                                    min_token_prob=0.0, **options)
    fixed = Engine.from_pretrained(target=tiny_target, drafter="hybrid", draft=str(tiny_medusa_dir),
                                   adaptive=False, num_speculative_tokens=4, **options)
    want = [plain.generate(p, GREEDY).token_ids for p in PROMPTS]
    drafted = 0
    for engine in (hybrid, fixed):
        for prompt, tokens in zip(PROMPTS, want):
            out = engine.generate(prompt, GREEDY)
            assert out.token_ids == tokens
            drafted += out.stats.num_draft_tokens
        assert generate_batch(engine, PROMPTS, GREEDY, max_batch=2) == want
    assert drafted > 0


def test_union_drafts_from_both_sources(tiny_target, tiny_medusa_dir):
    """On a repeating prompt the union's tree holds the suffix match and Medusa's guesses."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="hybrid", draft=str(tiny_medusa_dir),
                                    min_token_prob=0.0)
    session = engine.drafter.new_session()

    class Seq:
        hidden = torch.randn(64)

    session.attach(Seq())
    context = PROMPTS[0]
    tree = session.propose(context, 4, GREEDY, None)
    suffix = session.suffix.propose(context, 4, GREEDY, None)
    medusa = session.medusa.draft(4, None)
    assert suffix.num_nodes and medusa.num_nodes
    assert _paths(tree) == _paths(merge_trees(suffix, medusa))
    assert all(0.0 <= s <= 1.0 for s in medusa.scores)
    assert session.propose(context, 4, GREEDY, None, max_nodes=3).num_nodes == 3


SAMPLED = SamplingParams(temperature=2.0, top_k=3, max_new_tokens=3, ignore_eos=True)
SAMPLED_PROMPT = [11, 12, 11, 12, 11]
NUM_SAMPLED = 1200


def test_sampling_follows_the_target(tiny_target, tiny_medusa_dir):
    """Both sources are deterministic (q one-hot), merged into one tree: the first two sampled
    tokens (fixed seeds) follow the target's exact joint distribution (G-test), with drafts both
    accepted and rejected on the way."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="hybrid", draft=str(tiny_medusa_dir), adaptive=False,
                                    min_token_prob=0.0, num_speculative_tokens=3)
    outs = []
    for seed in range(NUM_SAMPLED):
        engine.drafter.reset()  # the global store would otherwise learn the earlier samples
        outs.append(engine.generate(SAMPLED_PROMPT, dataclasses.replace(SAMPLED, seed=seed)))
    accepted, drafted = sum(o.stats.num_accepted_tokens for o in outs), sum(o.stats.num_draft_tokens for o in outs)
    assert all(o.stats.num_draft_tokens > 0 for o in outs) and 0 < accepted < drafted
    exact = exact_joint(target_next_probs(tiny_target, SAMPLED), SAMPLED_PROMPT)
    assert_follows([tuple(o.token_ids[:2]) for o in outs], exact)


def test_options_are_checked(tiny_target, tiny_medusa_dir):
    with pytest.raises(InvalidArgument, match="hybrid mode must be one of union, choose"):
        Engine.from_pretrained(target=tiny_target, drafter="hybrid", draft=str(tiny_medusa_dir), mode="both")
    with pytest.raises(InvalidArgument, match="drafter 'hybrid' takes no option top_k"):
        Engine.from_pretrained(target=tiny_target, drafter="hybrid", draft=str(tiny_medusa_dir), top_k=3)
    with pytest.raises(InvalidArgument, match="no trained medusa drafter is shipped for the target"):
        Engine.from_pretrained(target=tiny_target, drafter="hybrid")


def test_every_entry_point_accepts_the_hybrid_drafter():
    from specdec.bench.methods import resolve_methods
    from specdec.bench.workload_bench import DEFAULT_METHODS
    from specdec.cli import build_parser
    from specdec.commands.serve import stack_config

    parser = build_parser()
    assert parser.parse_args(["generate", "--drafter", "hybrid", "hi"]).drafter == "hybrid"
    assert parser.parse_args(["loadtest", "--drafter", "hybrid"]).drafter == "hybrid"
    served = stack_config(parser.parse_args(["serve", "--drafter", "hybrid"]))
    assert served.drafts == () and served.targets[0].drafter == "hybrid"  # it reads the target's features
    assert [m.drafter for m in resolve_methods(["hybrid", "hybrid-choose"])] == ["none", "hybrid", "hybrid"]
    assert "hybrid" in DEFAULT_METHODS
