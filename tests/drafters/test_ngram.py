"""Prompt lookup (specdec.drafters.ngram): which matches it finds, how it scores them, and that the
policy drafts deeper on longer matches."""
from __future__ import annotations

import numpy as np
import pytest

from specdec.core.types import SamplingParams
from specdec.drafters.ngram import (NgramConfig, NgramDrafter, continuation, find_matches, match_score, merge)
from specdec.errors import InvalidArgument
from specdec.policy.budget import CostTable, node_order
from specdec.policy.depth import DepthConfig, DepthController

GREEDY = SamplingParams()


def propose(context, max_tokens=16, max_nodes=None, **options):
    return NgramDrafter(NgramConfig(**options)).new_session().propose(list(context), max_tokens, GREEDY, None,
                                                                      max_nodes)


def test_matches_come_longest_first_then_most_recent():
    #          0  1  2  3  4  5  6  7  8  9 10 11 12
    context = [7, 1, 2, 9, 1, 2, 8, 5, 1, 2, 4, 1, 2]
    found = list(find_matches(np.array(context), NgramConfig(min_ngram=1)))
    # "1 2" ends at 9, 5 and 2 (each preceded by another token than the suffix's 4); "2" alone nowhere else
    assert found == [(2, 9), (2, 5), (2, 2)]
    context = [3, 1, 2, 9, 4, 1, 2, 6, 4, 1, 2]  # "4 1 2" (ends at 6) comes before the shorter "1 2" (at 2)
    assert list(find_matches(np.array(context), NgramConfig(min_ngram=1)))[:2] == [(3, 6), (2, 2)]


def test_min_and_max_ngram_bound_the_matches():
    context = np.array([5, 6, 7, 8, 0, 5, 6, 7, 8])
    assert list(find_matches(context, NgramConfig(min_ngram=1)))[0] == (4, 3)
    assert list(find_matches(context, NgramConfig(max_ngram=2, min_ngram=1)))[0] == (2, 3)  # counted up to 2
    assert list(find_matches(np.array([1, 2, 3, 9, 3]), NgramConfig(min_ngram=2))) == []  # a 1-token match only
    assert list(find_matches(np.array([1, 2, 3, 9, 3]), NgramConfig(min_ngram=1))) == [(1, 2)]


def test_continuation_repeats_a_pattern_past_the_context_end():
    assert continuation(np.array([4, 1, 2, 1, 2]), 2, 5) == [1, 2, 1, 2, 1]
    assert continuation(np.array([4, 1, 2, 3, 4, 1]), 0, 3) == [1, 2, 3]


def test_scores_grow_with_the_match_and_fall_with_depth():
    assert match_score(20, 4) > match_score(5, 4) > match_score(1, 4)
    assert match_score(8, 1) > match_score(8, 2) > match_score(8, 16) > 0.0
    assert match_score(3, 0) == 1.0


def test_trie_scores_are_probabilities_of_paths():
    tree = merge([(6, [1, 2, 3]), (2, [1, 5]), (1, [4, 4])], max_nodes=16)
    assert tree.token_ids == (1, 2, 3, 5, 4, 4) and tree.parent_ids == (-1, 0, 1, 0, -1, 4)
    scores = tree.scores
    for i, parent in enumerate(tree.parent_ids):  # never above the parent
        assert 0.0 < scores[i] <= (1.0 if parent < 0 else scores[parent])
    assert scores[0] + scores[4] <= 1.0  # the root's children: at most one of them is right
    assert scores[1] + scores[3] <= scores[0]
    assert scores[:3] == pytest.approx([match_score(6, d) for d in (1, 2, 3)])  # the best candidate alone


def test_a_node_cap_keeps_the_likeliest_closed_subtree():
    tree = merge([(30, list(range(10, 26))), (1, [3, 4, 5])], max_nodes=8)
    assert tree.num_nodes == 8 and tree.token_ids == tuple(range(10, 18))  # the long match's chain wins
    assert all(p < i for i, p in enumerate(tree.parent_ids))
    assert propose([1, 2, 3, 1, 2] * 8, max_tokens=16, max_nodes=5).num_nodes == 5


def test_proposals_reach_the_node_budget_and_stop_at_the_depth():
    context = list(range(100, 140)) + [7] + list(range(100, 110))  # a 10-token match with 30 more after it
    tree = propose(context, max_tokens=24, num_nodes=24, num_branches=1)
    assert tree.token_ids == tuple(range(110, 134))  # deeper than the old fixed 8
    assert propose(context, max_tokens=5).token_ids == tuple(range(110, 115))
    assert propose([1, 2, 3]).num_nodes == 0  # nothing to copy
    assert propose([1]).num_nodes == 0 and propose(context, max_tokens=0).num_nodes == 0


def kept_nodes(tree) -> int:
    """How many of the tree's nodes a sequence's controller verifies, at a cost that grows with the rows."""
    controller = DepthController(DepthConfig(max_depth=16), t_plain=1.0)
    controller.row_costs = CostTable(0.9)
    controller.row_costs.means.update({rows: 1.0 + 0.04 * (rows - 1) for rows in (1, 2, 4, 8, 17)})
    return controller.scored_nodes([p for _, p in node_order(tree, alpha=0.5)])


def test_the_proposal_verified_grows_with_the_match_length():
    tail = list(range(200, 230))
    short = [9, 50, 51] + tail + [8, 50, 51]  # the end "50 51" was seen once, 2 tokens long
    long = list(range(40, 52)) + tail + list(range(40, 52))  # ... 12 tokens long
    lone = [9, 51] + tail + [8, 51]  # a one-token match
    depths = [kept_nodes(propose(c, num_branches=1)) for c in (lone, short, long)]
    assert depths[0] < depths[1] < depths[2] == 16


def test_config_is_checked():
    with pytest.raises(InvalidArgument):
        NgramConfig(min_ngram=3, max_ngram=2)
    with pytest.raises(InvalidArgument):
        NgramConfig(num_nodes=0)
    with pytest.raises(InvalidArgument):
        NgramConfig(num_branches=0)
    assert NgramDrafter(NgramConfig(num_nodes=12)).default_depth == 12
