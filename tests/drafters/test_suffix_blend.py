"""Blending matches into one candidate tree: which matches become sources, how they are weighted
(longer and own matches trusted more), and the tree's shape (deep on a long match, wide on short ones)."""
from __future__ import annotations

import pytest

from specdec.core.types import SamplingParams
from specdec.drafters.suffix import SuffixConfig, SuffixDrafter
from specdec.drafters.suffix_blend import GLOBAL, OWN, Source, blended_tree, carry, sources, trust, weights
from specdec.drafters.suffix_tree import SuffixTrie

GREEDY = SamplingParams()
# [9] went on four times (to 40 once, 41 three times); [5, 7, 8, 9] once, to 40; the context ends with it again
TEXT = [5, 7, 8, 9, 40, 6, 9, 41, 6, 9, 41, 6, 9, 41, 5, 7, 8, 9]


def _trie(tokens: list[int], max_depth: int = 24) -> SuffixTrie:
    trie = SuffixTrie(max_depth)
    for token in tokens:
        trie.append(token)
    return trie


def _root_children(tokens, parents) -> list[int]:
    return [t for t, p in zip(tokens, parents) if p == -1]


def test_sources_are_the_distinct_matches_longest_first():
    found = sources(_trie(TEXT), OWN, TEXT, reserve=8)
    # [7, 8, 9] and [8, 9] occurred exactly where [5, 7, 8, 9] did: they add nothing and are skipped
    assert [s.match_len for s in found] == [4, 1]
    assert sources(_trie(TEXT), OWN, TEXT[:-1] + [99], reserve=8) == []  # nothing to match


def test_longer_and_own_matches_are_trusted_more():
    assert trust(OWN, 1) < trust(OWN, 2) < trust(OWN, 8) < trust(OWN, 20) < 1.0
    assert all(trust(GLOBAL, m) < trust(OWN, m) for m in range(1, 24))
    rated = weights(sources(_trie(TEXT), OWN, TEXT, reserve=8))
    assert [s.match_len for _, s in rated] == [4, 1]
    assert rated[0][0] > rated[1][0] > 0 and sum(w for w, _ in rated) < 1.0  # a back-off chain leaves mass over


def test_shorter_matches_add_the_alternatives_the_longest_one_misses():
    rated = weights(sources(_trie(TEXT), OWN, TEXT, reserve=8))
    tokens, parents, probs = blended_tree(rated, max_tokens=4, max_nodes=16, min_prob=0.0)
    assert _root_children(tokens, parents) == [40, 41]  # the long match's continuation first, then the frequent one
    (w_long, _), (w_short, _) = rated
    assert sum(probs) >= (w_long + w_short / 4) + 3 * w_short / 4  # the two root candidates' blended probabilities
    # the longest match alone (the rule before blending) would have proposed 40 only
    assert _root_children(*blended_tree(rated[:1], 4, 16, 0.0)[:2]) == [40]


def test_own_text_outranks_the_global_store_at_the_same_match_length():
    drafter = SuffixDrafter(SuffixConfig(min_token_prob=0.0))
    drafter.store.add([1, 7, 8, 9, 60])  # an earlier generation: [7, 8, 9] went on with 60
    context = [2, 7, 8, 9, 50, 3, 7, 8, 9]  # this request: [7, 8, 9] went on with 50
    tree = drafter.new_session().propose(context, 4, GREEDY, None)
    assert _root_children(tree.token_ids, tree.parent_ids) == [50, 60]


@pytest.mark.parametrize("max_tokens", [3, 6])
def test_deep_on_a_long_match_wide_on_a_short_one(max_tokens):
    session = SuffixDrafter(SuffixConfig(global_tokens=0)).new_session()
    run = list(range(100, 130))
    deep = session.propose(run + [1] + run[:12], max_tokens, GREEDY, None)  # a 12-token verbatim repeat
    assert list(deep.token_ids) == run[12:12 + max_tokens] and list(deep.parent_ids) == list(range(-1, max_tokens - 1))
    # [5] went on three different ways, once each: a one-token match, every continuation a candidate
    session = SuffixDrafter(SuffixConfig(global_tokens=0, spec_factor=4.0)).new_session()
    wide = session.propose([5, 11, 12, 5, 21, 22, 5, 31, 32, 5], max_tokens, GREEDY, None)
    assert _root_children(wide.token_ids, wide.parent_ids) == [11, 21, 31]
    assert wide.num_nodes <= 4  # spec_factor * the match length


def test_a_continuation_is_less_sure_the_further_it_runs_past_a_short_match():
    """One earlier occurrence (count 1 all the way) is not as sure at its 8th token as at its first:
    each token keeps carry(match so far) of the weight, so a one-token coincidence's copy fades fast
    and a long verbatim match's hardly at all; carry_miss 0 scores the whole copy as its first token."""
    assert carry(1, 0.2) < carry(4, 0.2) < carry(20, 0.2) < 1.0 and carry(1, 0.0) == 1.0
    text = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20]
    trie = _trie(text + [99] + text[:12])  # the context ends with the first 12 tokens again
    short = [(1.0, Source(OWN, 1, trie, trie.find([12])))]  # [12] alone: a one-token match
    long = [(1.0, Source(OWN, 12, trie, trie.find(text[:12])))]
    flat = blended_tree(short, 8, 16, 0.0)[2]
    assert flat == pytest.approx([1.0] * 8)
    fading = blended_tree(short, 8, 16, 0.0, carry_miss=0.2)[2]
    assert all(a > b for a, b in zip(fading, fading[1:])) and fading[0] == 1.0
    kept = blended_tree(long, 8, 16, 0.0, carry_miss=0.2)[2]
    assert kept[-1] > 0.8 and fading[-1] < 0.5


def test_a_shallow_alternative_outranks_the_tail_of_a_copy():
    """After [9] the text went on three times with the same run (40 50 60 70) and twice with 41: with
    a node budget of 4, scores that never fade fill it with the run (3/5 at every token, over 41's
    2/5); fading ones verify 41 in place of the run's fourth token."""
    context = [1, 9, 40, 50, 60, 70, 2, 9, 40, 50, 60, 70, 3, 9, 40, 50, 60, 70, 4, 9, 41, 7, 5, 9, 41, 8, 6, 9]
    found = weights(sources(_trie(context), OWN, context, reserve=8))
    assert [s.match_len for _, s in found] == [1]
    assert blended_tree(found, 8, 4, 0.0)[0] == [40, 50, 60, 70]
    tokens, parents, _ = blended_tree(found, 8, 4, 0.0, carry_miss=0.2)
    assert tokens == [40, 50, 60, 41] and _root_children(tokens, parents) == [40, 41]
