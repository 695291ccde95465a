"""The suffix drafter: its session against the engine's contract (limits, rollback, the global store
fed at the end of a generation), and exact sampling through the engine (G-test)."""
from __future__ import annotations

import pytest

from distribution import exact_joint, g_test_kl, target_next_probs
from specdec import Engine, SamplingParams
from specdec.drafters import build_drafter
from specdec.drafters.suffix import SuffixConfig, SuffixDrafter
from specdec.errors import InvalidArgument

GREEDY = SamplingParams()
pytestmark = pytest.mark.usefixtures("one_thread")


def test_proposals_respect_depth_and_node_limits():
    session = SuffixDrafter(SuffixConfig(min_token_prob=0.0, spec_factor=1.0)).new_session()
    context = list(range(50, 80)) + [1] + list(range(50, 60))  # a 10-token match of a 30-token run
    full = session.propose(context, 16, GREEDY, None)
    assert list(full.token_ids) == list(range(60, 70)) and full.q is None  # spec_factor 1: 10 nodes
    for max_tokens, max_nodes in ((3, None), (16, 4), (2, 1), (0, None), (8, 0)):
        tree = session.propose(context, max_tokens, GREEDY, None, max_nodes=max_nodes)
        depth = max((len(_path(tree, i)) for i in range(tree.num_nodes)), default=0)
        assert depth <= max_tokens and (max_nodes is None or tree.num_nodes <= max_nodes)
        assert all(-1 <= p < i for i, p in enumerate(tree.parent_ids))
    assert session.propose([7, 8, 9], 8, GREEDY, None).num_nodes == 0  # nothing to match


def _path(tree, node):
    path = []
    while node != -1:
        path.append(node)
        node = tree.parent_ids[node]
    return path


def test_session_resynchronises_after_a_rollback():
    """A pipelined guess that was rejected: the session's trie drops it, as if never seen."""
    drafter = SuffixDrafter(SuffixConfig(min_token_prob=0.0, global_tokens=0))
    base = [5, 6, 7, 8, 9, 10, 11, 5, 6, 7]
    rolled = drafter.new_session()
    rolled.propose(base + [99, 98, 5, 6, 7, 42], 8, GREEDY, None)  # a guessed tail, then back to base
    fresh = drafter.new_session()
    for context in (base, base + [8, 9], list(range(40)) + base):  # the last one rebuilds (long rollback)
        assert rolled.propose(context, 8, GREEDY, None) == fresh.propose(context, 8, GREEDY, None)
        assert rolled.trie.tokens == context


def test_global_store_learns_from_closed_generations_only():
    drafter = SuffixDrafter(SuffixConfig(min_token_prob=0.0, spec_factor=1.0))
    prompt, output = [1, 2, 3, 4], [20, 21, 22, 23, 24, 25]
    first = drafter.new_session()
    assert first.propose(prompt, 8, GREEDY, None).num_nodes == 0
    first.propose(prompt + output, 8, GREEDY, None)
    assert drafter.new_session().propose(prompt, 8, GREEDY, None).num_nodes == 0  # not before it is closed
    first.close(prompt + output, len(prompt))
    first.close(prompt + output, len(prompt))  # twice is once
    assert drafter.store.num_sequences == 1 and drafter.store.num_tokens == len(prompt + output)
    tree = drafter.new_session().propose([9] + prompt, 8, GREEDY, None)
    assert list(tree.token_ids) == output[:4]  # the prompt's end leads into the earlier answer (4-token match)
    drafter.reset()
    assert drafter.new_session().propose(prompt, 8, GREEDY, None).num_nodes == 0


def test_options_are_checked():
    for bad in (dict(max_depth=1), dict(spec_factor=0), dict(min_token_prob=1.5), dict(num_nodes=0),
                dict(global_tokens=-1)):
        with pytest.raises(InvalidArgument):
            build_drafter("suffix", None, None, bad, None)
    with pytest.raises(InvalidArgument, match="takes no option"):
        build_drafter("suffix", None, None, {"tree_width": 2}, None)
    assert build_drafter("suffix", None, None, {"global_tokens": 0}, None).store is None


def test_engine_feeds_the_global_store_and_repeats_get_cheaper(tiny_target):
    """A second identical greedy request drafts from the first one's answer: same tokens, fewer forwards.

    Fixed depth: the adaptive controller fits step times, and on a loaded machine it may rightly choose
    not to draft, which is not what this test is about."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="suffix", adaptive=False, num_speculative_tokens=8)
    params = SamplingParams(max_new_tokens=30, ignore_eos=True)
    first = engine.generate([11, 12, 13], params)
    assert engine.drafter.store.num_sequences == 1
    again = engine.generate([11, 12, 13], params)
    assert again.token_ids == first.token_ids
    assert again.stats.num_target_forwards < first.stats.num_target_forwards
    assert again.stats.tau > 3


def test_sampled_tokens_follow_target_distribution(tiny_target):
    """Deterministic drafts (q = None), learnt from earlier samples of the same prompt: the first two
    sampled tokens still have the target's exact joint distribution."""
    params = SamplingParams(temperature=1.0, top_k=20)
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    engine = Engine.from_pretrained(target=tiny_target, drafter="suffix", adaptive=False, num_speculative_tokens=3,
                                    min_token_prob=0.0)
    num_draws = 2000
    counts: dict = {}
    accepted = drafted = 0
    for seed in range(num_draws):
        run = SamplingParams(temperature=1.0, top_k=20, seed=seed, max_new_tokens=4, ignore_eos=True)
        out = engine.generate(prompt, run)
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += out.stats.num_accepted_tokens
        drafted += out.stats.num_draft_tokens
    assert num_draws // 2 < accepted < 0.9 * drafted  # drafts were accepted and rejected along the way
    kl, tolerance = g_test_kl(counts, exact_joint(target_next_probs(tiny_target, params), prompt), num_draws)
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f}"


def test_every_entry_point_accepts_the_suffix_drafter():
    from specdec.bench.methods import resolve_methods
    from specdec.cli import build_parser
    from specdec.commands.serve import stack_config
    from specdec.serving_config import DraftConfig

    parser = build_parser()
    assert parser.parse_args(["generate", "--drafter", "suffix", "hi"]).drafter == "suffix"
    assert parser.parse_args(["loadtest", "--drafter", "suffix"]).drafter == "suffix"
    served = stack_config(parser.parse_args(["serve", "--drafter", "suffix"]))
    assert [d.drafter for d in served.drafts] == ["suffix"] and served.targets[0].drafter == "none"
    assert parser.parse_args(["serve", "draft", "--drafter", "suffix"]).drafter == "suffix"
    with pytest.raises(InvalidArgument, match="ngram, suffix or draft"):
        DraftConfig(drafter="medusa")
    assert [m.drafter for m in resolve_methods(["suffix"])] == ["none", "suffix"]
