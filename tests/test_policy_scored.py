"""Scored drafts (DraftTree.scores): a drafter that knows how far to trust each node drafts the whole
depth, and the controller verifies the nodes worth their measured cost, its scores calibrated against
what the target accepted; a generation starts from the step costs the engine's last one measured."""
import random

import pytest

from specdec.core.tree import DraftTree
from specdec.errors import InvalidArgument
from specdec.policy import PolicyConfig, SpeculationPolicy, keep_nodes, node_order
from specdec.policy.depth import Calibration, DepthConfig, DepthController

T_PLAIN = 0.0137  # a one-row forward, seconds


def flat_then_steep(rows: int) -> float:
    """specdec's kernels on two threads: nearly flat to 9 rows, then ~0.8 ms a row."""
    return T_PLAIN * (1 + 0.01 * (rows - 1)) if rows <= 9 else T_PLAIN * 1.08 + 0.0008 * (rows - 9)


def chain_with_siblings(depth: int, sure: float, unsure: float) -> DraftTree:
    """A chain of `depth` nodes scored `sure` each step deeper (its path's probability), and beside
    every chain node a sibling scored `unsure`."""
    tokens, parents, scores = [], [], []
    parent, path = -1, 1.0
    for level in range(depth):
        tokens += [100 + level, 200 + level]
        parents += [parent, parent]
        path *= sure
        scores += [path, unsure * path / sure]
        parent = len(tokens) - 2
    return DraftTree(tuple(tokens), tuple(parents), scores=tuple(scores))


def run(policy: SpeculationPolicy, trees, accepted, num_steps: int, cost=flat_then_steep) -> list[int]:
    """num_steps steps of one sequence offered `trees` (one tree, or a list taken in turn);
    accepted(verified tree) -> tokens accepted. Returns the nodes verified per step."""
    trees = trees if isinstance(trees, list) else [trees]
    verified = []
    for step in range(num_steps):
        budget = policy.plan("s", 64, scored=True)
        tree = trees[step % len(trees)]
        drafted = tree if budget.depth >= 8 else DraftTree.empty()  # a scored sequence drafts the whole depth
        (cut,) = policy.allocate(["s"], [drafted], [False])
        n = accepted(cut) if cut.num_nodes else 0
        depth = max((_depth(cut, i) for i in range(cut.num_nodes)), default=0)
        policy.observe("s", depth, n, cost(cut.num_nodes + 1), cut.scores if cut.num_nodes else None,
                       cut.parent_ids if cut.num_nodes else None)
        verified.append(cut.num_nodes)
    return verified


def _depth(tree: DraftTree, node: int) -> int:
    return 0 if node < 0 else 1 + _depth(tree, tree.parent_ids[node])


def chain_accepted(cut: DraftTree) -> int:
    """The target follows the chain (tokens 100, 101, ...) to its end."""
    return sum(1 for t in cut.token_ids if 100 <= t < 200)


def new_policy(max_depth: int = 8) -> SpeculationPolicy:
    policy = SpeculationPolicy(PolicyConfig(max_depth=max_depth, load_aware=False))
    policy.add("s")
    return policy


def test_a_sure_long_match_is_drafted_whole_depth_even_at_low_acceptance():
    """The sequence's acceptance so far is poor (its alpha says: draft 1-2 deep), but the drafter is
    sure of this 8-token copy: the controller verifies all of it and none of the unsure siblings that
    cost more than they promise."""
    policy = new_policy()
    seq = policy.seqs["s"]
    seq.acceptance.accepted, seq.acceptance.rejections = 1.0, 9.0  # alpha 0.1
    run(policy, DraftTree.empty(), chain_accepted, 2)  # one plain step: t_plain
    assert seq.depth() <= 2  # what the chain model alone would draft
    tree = chain_with_siblings(8, sure=0.97, unsure=0.01)
    verified = run(policy, tree, chain_accepted, 30)
    last = policy.allocate(["s"], [tree], [False])[0]
    assert verified[-1] == 8 and sorted(last.token_ids) == list(range(100, 108))


def test_nodes_are_kept_while_they_pay_for_their_rows():
    """Siblings of probability 0.3 are not worth a row where each costs ~6% of a forward (beyond 9):
    once steps of both sizes were measured (the drafter offers a bare chain now and then), the cut
    keeps the chain and leaves the siblings out. Where rows cost nearly nothing, it keeps them all."""
    tree = chain_with_siblings(8, sure=0.95, unsure=0.3)
    chain = keep_nodes(tree, list(range(0, 16, 2)))
    policy = new_policy()
    verified = run(policy, [tree, tree, tree, chain], chain_accepted, 40)
    assert verified[-2] == 8 and sorted(policy.allocate(["s"], [tree], [False])[0].token_ids) == list(range(100, 108))
    policy = new_policy()
    verified = run(policy, [tree, tree, tree, chain], chain_accepted, 40, cost=lambda rows: T_PLAIN * (1 + 0.001 * rows))
    assert verified[-2] == tree.num_nodes


def test_overconfident_scores_lose_their_say_and_drafting_stops():
    """Scores that promise much and are never right: calibration falls, steps go plain apart from
    backed-off probes, and the sequence costs at most ~10% more than plain decoding."""
    policy = new_policy()
    tree = chain_with_siblings(8, sure=0.9, unsure=0.5)
    verified = run(policy, tree, lambda cut: 0, 400)
    calibration = policy.seqs["s"].calibration
    assert max(calibration.scale_at(d) for d in range(1, 9)) < 0.1
    assert sum(1 for v in verified[-200:] if v) <= 200 / 16  # only occasional probes late on
    spent = sum(flat_then_steep(v + 1) for v in verified)
    assert spent <= 1.10 * 400 * T_PLAIN


def test_a_depth_no_longer_verified_regains_its_say():
    """A copy that kept breaking after its first token drives the deeper depths' scales down, and
    the policy stops verifying nodes there. Those depths then get no evidence: their verdict must
    fade (the prior regains weight) rather than stay frozen, or a later copy that is right all the
    way is never verified deep again. A depth that is verified and wrong still loses its say."""
    calibration, decay = Calibration(), 0.9
    chain = (-1, 0, 1, 2)
    for _ in range(30):  # a 4-node copy, right at its first token only
        calibration.record((0.9, 0.9, 0.9, 0.9), chain, 1, decay)
    assert calibration.scale_at(1) > 0.9 and calibration.scale_at(3) < 0.2
    for _ in range(40):  # only one-node trees verified from now on, all right
        calibration.record((0.9,), (-1,), 1, decay)
    assert calibration.scale_at(1) > 0.9
    assert calibration.scale_at(3) > 0.8  # back near the depth above: deep nodes are verified again
    wrong = Calibration()
    for _ in range(70):  # depth 3 verified at every step and never right: it stays cut
        wrong.record((0.9, 0.9, 0.9, 0.9), chain, 1, decay)
    assert wrong.scale_at(3) < 0.05


def test_calibration_is_per_depth_so_a_deep_false_copy_does_not_cut_shallow_guesses_that_pay():
    """A 16-node chain scored 0.6 at every depth (one earlier occurrence, as suffix decoding scores it)
    that is never right, beside three first-token guesses at 0.3 of which one (token 300) always is.
    One scale over all depths (accepted 1 of ~10 promised) would price the guesses at 0.03 each, under
    what a row costs here (3.5% of a step), cut them and stop drafting; per depth, the first depth
    keeps its say, the chain's deeper nodes lose theirs, and the step verifies the guesses."""
    tokens, parents, scores = [], [], []
    for level in range(16):
        tokens.append(100 + level)
        parents.append(level - 1)
        scores.append(0.6)
    for token in (300, 301, 302):
        tokens.append(token)
        parents.append(-1)
        scores.append(0.3)
    tree = DraftTree(tuple(tokens), tuple(parents), scores=tuple(scores))
    policy = new_policy(max_depth=16)
    verified = run(policy, tree, lambda cut: 1 if 300 in cut.token_ids else 0, 60,
                   cost=lambda rows: T_PLAIN * (1 + 0.035 * (rows - 1)))
    calibration = policy.seqs["s"].calibration
    assert calibration.scale_at(1) > 0.5 and calibration.scale_at(3) < 0.2
    (cut,) = policy.allocate(["s"], [tree], [False])
    assert 300 in cut.token_ids and not {102, 103} & set(cut.token_ids)
    assert all(verified[-10:])  # every late step drafts (no fall back to plain steps and probes)


def test_unadaptive_policy_verifies_the_whole_scored_tree():
    policy = SpeculationPolicy(PolicyConfig(max_depth=8, adaptive=False, load_aware=False))
    policy.add("s")
    tree = chain_with_siblings(4, sure=0.5, unsure=0.01)
    assert policy.plan("s", 64, scored=True).depth == 8
    assert policy.allocate(["s"], [tree], [False])[0] == tree


def test_scored_order_keeps_parents_first_whatever_the_scores():
    """A child scored above its parent (a careless drafter) still comes after it, so every prefix of
    the order is a tree; the scale (calibration) multiplies, capped by the parent's."""
    tree = DraftTree((1, 2, 3, 4), (-1, 0, 1, -1), scores=(0.5, 0.9, 0.2, 0.4))
    order = node_order(tree, alpha=0.9, scale=0.5)
    assert [i for i, _ in order] == [0, 1, 3, 2]
    assert [p for _, p in order] == pytest.approx([0.25, 0.25, 0.2, 0.1])
    for r in range(5):
        keep_nodes(tree, sorted(i for i, _ in order[:r])).validate(10, 64)
    assert keep_nodes(tree, [0, 1]).scores == (0.5, 0.9)


def test_scores_are_checked():
    with pytest.raises(InvalidArgument, match="probabilities"):
        DraftTree((1, 2), (-1, 0), scores=(0.5,)).validate(10, 64)
    with pytest.raises(InvalidArgument, match="probabilities"):
        DraftTree((1,), (-1,), scores=(1.5,)).validate(10, 64)


def test_a_new_sequence_starts_from_the_last_ones_costs():
    """The machine's step costs carry over (no plain step to measure them again); the
    calibration comes as a prior, not with the last sequence's full weight; a carried row cost is a guess
    that the sequence's own first step of that size replaces."""
    earlier = new_policy()
    tree = chain_with_siblings(8, sure=0.95, unsure=0.3)
    run(earlier, tree, lambda cut: min(chain_accepted(cut), 4), 30)
    earlier.remove("s")
    later = SpeculationPolicy(PolicyConfig(max_depth=8, load_aware=False)).continue_from(earlier)
    later.add("s")
    seq, old = later.seqs["s"], earlier.learned
    assert seq.t_plain == old.t_plain and seq.row_costs.means == old.row_costs.means
    assert seq.row_costs is not old.row_costs  # its own table from here on
    assert seq.calibration.scale_at(1) == pytest.approx(old.calibration.scale_at(1))
    assert sum(seq.calibration.promised) < sum(old.calibration.promised)
    assert later.plan("s", 64, scored=True).depth == 8  # drafts at once
    fresh = new_policy()
    assert fresh.plan("s", 64, scored=True).depth == 0  # a first generation measures a plain step first
    rows = max(seq.row_costs.means)
    seq.record(8, 8, 5.0, tuple([0.5] * (rows - 1)))  # a load spike is this sequence's own measurement...
    seq.record(8, 8, 0.02, tuple([0.5] * (rows - 1)))
    assert seq.row_costs.means[rows] == pytest.approx(0.9 * 5.0 + 0.1 * 0.02)  # ...and decays as usual
    unmeasured = set(seq.guessed_rows)
    later.remove("s")
    later.add("u")  # guesses the last sequence never replaced are not passed on
    assert unmeasured and not unmeasured & set(later.seqs["u"].row_costs.means)
    assert rows in later.seqs["u"].row_costs.means


def test_a_load_spike_in_one_sequence_does_not_stop_the_next_from_drafting():
    """Prompt lookup's chain model: speculative steps of one sequence measured 20x a plain step (a
    passing spike) make it stop drafting; the next sequence keeps only the plain step time, and
    drafts (a short probe) at once to measure speculative steps afresh."""
    policy = new_policy()
    seq = policy.seqs["s"]
    seq.record(0, 0, T_PLAIN)
    for _ in range(10):
        seq.record(2, 2, 20 * T_PLAIN)
    assert seq.depth() == 0
    policy.remove("s")
    policy.add("t")
    assert policy.plan("t", 64).depth == 2 and policy.seqs["t"].t_plain == T_PLAIN


def test_random_cuts_of_scored_trees_stay_valid_trees():
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(1, 16)
        parents = tuple(rng.randint(-1, i - 1) for i in range(n))
        scores = tuple(rng.random() for _ in range(n))
        tree = DraftTree(tuple(range(n)), parents, scores=scores)
        controller = DepthController(DepthConfig(), t_plain=T_PLAIN)
        order = node_order(tree, 0.5, rng.uniform(0.2, 2.0))
        r = controller.scored_nodes([p for _, p in order])
        keep_nodes(tree, sorted(i for i, _ in order[:r])).validate(n, 64)


def test_tensor_parallel_ranks_cut_to_rank_zeros_count():
    """Under --tp every rank cuts its own copy of the same scored tree, by counts that follow its own
    timings: `agree` (rank 0's count, broadcast) makes them verify the same nodes, likeliest first."""
    tree = chain_with_siblings(8, sure=0.95, unsure=0.3)
    policy = new_policy()
    run(policy, [tree, tree, tree], chain_accepted, 10)
    asked = []
    for count in (3, 0, 5):
        def rank0(own: int, count=count) -> int:
            asked.append(own)
            return count
        (cut,) = policy.allocate(["s"], [tree], [False], agree=rank0)
        assert cut.num_nodes == count and sorted(cut.token_ids) == list(range(100, 100 + count))
    assert len(asked) == 3  # one agreement per scored tree
    loaded = SpeculationPolicy(PolicyConfig(max_depth=8, load_aware=True))  # the batch budget's R too
    loaded.add("a"), loaded.add("b")
    cuts = loaded.allocate(["a", "b"], [tree, tree], [False, False], agree=lambda own: 2)
    assert [c.num_nodes for c in cuts] == [2, 2]


def test_a_step_timed_the_slow_way_teaches_acceptance_not_cost():
    """A forward the thread team ran alone on purpose (a probe, ~1.9x a step's cost) must not make its
    row count look dear: what it accepted is learnt, its seconds are not, on both the sequence's
    controller and the batch budget."""
    policy = SpeculationPolicy(PolicyConfig(max_depth=8))
    policy.add("s")
    tree = chain_with_siblings(4, sure=0.9, unsure=0.2)
    seq = policy.seqs["s"]
    policy.record(["s"], [DraftTree.empty()], [_Step(0, 0, [5])], T_PLAIN)
    policy.record(["s"], [tree], [_Step(4, 4, [1, 2, 3, 4, 5])], flat_then_steep(9))
    costs, budget_costs = dict(seq.row_costs.means), dict(policy.batch.costs.means)
    accepted, calibration = seq.acceptance.accepted, sum(seq.calibration.accepted)
    for _ in range(3):
        policy.record(["s"], [tree], [_Step(4, 4, [1, 2, 3, 4, 5])], 2 * flat_then_steep(9), timed=False)
        policy.record(["s"], [DraftTree.empty()], [_Step(0, 0, [5])], 2 * T_PLAIN, timed=False)
    assert seq.row_costs.means == costs and policy.batch.costs.means == budget_costs and seq.t_plain == T_PLAIN
    assert seq.acceptance.accepted > accepted and sum(seq.calibration.accepted) > calibration


class _Step:
    """What policy.record reads of a StepResult."""

    def __init__(self, depth: int, num_accepted: int, token_ids: list[int]):
        self.depth, self.num_accepted, self.token_ids = depth, num_accepted, token_ids
