"""The speculation policy: a sequence's own depth backs off when drafts fail and goes deep when they
pass; the batch node budget speculates where it pays (low load) and falls back to plain steps where it
does not (high load); cutting keeps valid trees and never cuts a sampled tree by its shape."""
import random
from dataclasses import dataclass

import pytest
import torch

from specdec.core.tree import DraftTree, tree_layout
from specdec.policy import NO_CAP, CostTable, PolicyConfig, SpeculationPolicy, keep_nodes, node_order
from specdec.policy.budget import BudgetConfig
from specdec.policy.depth import DepthConfig, DepthController

T_PLAIN, T_EXTRA, T_DRAFT = 0.053, 0.045, 0.004  # SmolLM2 on this CPU: 1-token forward, verify overhead, draft


@dataclass
class FakeStep:
    token_ids: list
    num_accepted: int
    depth: int


def simulate(batch: int, alpha: float | list[float], cost, num_steps: int = 400, enabled: bool = True, seed: int = 0,
             adaptive: bool = False, ragged: bool = False) -> float:
    """Tokens per second of `batch` sequences drafting 8-token chains accepted token by token with
    probability alpha (one for all, or one per sequence); cost(rows) = seconds of a verify forward over
    that many rows: padded (batch x the largest tree) or, ragged, every sequence's own."""
    rng = random.Random(seed)
    alphas = alpha if isinstance(alpha, list) else [alpha] * batch
    budget = SpeculationPolicy(PolicyConfig(adaptive=adaptive, load_aware=enabled), ragged=ragged)
    keys = [str(i) for i in range(batch)]
    for k in keys:
        budget.add(k)
    tokens = seconds = 0.0
    for _ in range(num_steps):
        trees = [DraftTree.chain([1] * budget.plan(k, 8).depth) for k in keys]
        trees = budget.allocate(keys, trees, [False] * batch)
        steps = []
        for tree, p in zip(trees, alphas):
            accepted = 0
            while accepted < tree.num_nodes and rng.random() < p:
                accepted += 1
            steps.append(FakeStep([0] * (accepted + 1), accepted, tree.num_nodes))
        rows = sum(1 + t.num_nodes for t in trees) if ragged else batch * (1 + max(t.num_nodes for t in trees))
        step_s = cost(rows)
        budget.record(keys, trees, steps, step_s)
        tokens += sum(len(s.token_ids) for s in steps)
        seconds += step_s
    return tokens / seconds


def cpu_like(rows: int) -> float:
    """This machine's shape: 1 row 53 ms, 2-16 rows ~100-130 ms, then compute-bound ~8 ms a row."""
    return 0.053 if rows == 1 else 0.1 + 0.002 * rows if rows <= 16 else 0.13 + 0.008 * (rows - 16)


def flat_cpu(rows: int) -> float:
    """specdec's kernels on two threads: 1 row 13.7 ms, 8 rows 14.15, 16 rows 20.5, then ~0.8 ms a row."""
    if rows <= 8:
        return 0.0137 + 0.00045 * (rows - 1) / 7
    return 0.01415 + 0.00635 * (rows - 8) / 8 if rows <= 16 else 0.0205 + 0.0008 * (rows - 16)


def gpu_like(rows: int) -> float:
    """Memory-bound until ~64 rows, then linear in rows."""
    return 0.02 + 0.0005 * max(rows - 64, 0)


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("cost", [cpu_like, flat_cpu, gpu_like])
@pytest.mark.parametrize("ragged", [False, True], ids=["padded", "ragged"])
def test_never_slower_than_plain(batch, alpha, cost, ragged):
    plain = batch / cost(batch)
    spec = simulate(batch, alpha, cost, ragged=ragged)
    assert spec >= 0.97 * plain, (spec, plain)


def test_ragged_budget_verifies_the_drafts_that_pass_where_padding_cannot_pay():
    """16 sequences on compute-bound costs, 4 whose drafts nearly always pass and 12 whose drafts fail.
    Padded, every node of the budget costs a row in all 16 sequences, so no budget pays: plain steps.
    Ragged, a node costs one row: the four verify their chains whole, the twelve decode plainly."""
    alphas = [0.95] * 4 + [0.1] * 12
    plain = 16 / flat_cpu(16)
    padded, ragged = (simulate(16, alphas, flat_cpu, ragged=r) for r in (False, True))
    assert padded < 1.03 * plain and ragged > 1.06 * plain and ragged > 1.05 * padded, (plain, padded, ragged)
    policy = SpeculationPolicy(PolicyConfig(max_depth=4, adaptive=False, budget=BudgetConfig(
        costs=tuple((rows, flat_cpu(rows)) for rows in range(1, 80)), learn_costs=False)), ragged=True)
    keys = [str(i) for i in range(16)]
    for key in keys:
        policy.add(key)
    for _ in range(30):  # four sequences whose drafts have passed, twelve whose drafts have failed
        for key in keys:
            policy.observe(key, 4, 4 if key in keys[:4] else 0, None)
    trees = policy.allocate(keys, [DraftTree.chain([1, 2, 3, 4])] * 16, [False] * 16)
    assert [t.num_nodes for t in trees] == [4] * 4 + [0] * 12


def test_ragged_budget_still_verifies_a_poor_drafter_now_and_then():
    """Ragged, the sequences whose drafts failed get no nodes while better ones exist, so their acceptance
    could never move again; one that has had none verified for explore_interval (32) steps gets a node."""
    rng = random.Random(0)
    policy = SpeculationPolicy(PolicyConfig(max_depth=4, adaptive=False), ragged=True)
    keys = [str(i) for i in range(16)]
    for key in keys:
        policy.add(key)
    verified = [0] * 16  # steps in which each sequence had a node verified
    for _ in range(600):
        trees = [DraftTree.chain([1] * policy.plan(k, 4).depth) for k in keys]
        trees = policy.allocate(keys, trees, [False] * 16)
        steps = []
        for i, tree in enumerate(trees):
            accepted = 0
            while accepted < tree.num_nodes and rng.random() < (0.95 if i < 4 else 0.1):
                accepted += 1
            steps.append(FakeStep([0] * (accepted + 1), accepted, tree.num_nodes))
            verified[i] += tree.num_nodes > 0
        policy.record(keys, trees, steps, flat_cpu(sum(1 + t.num_nodes for t in trees)))
    assert min(verified[:4]) > 300  # the good drafters verify most steps...
    assert 3 <= min(verified[4:]) and max(verified[4:]) < 60, verified  # ...the poor ones now and then


@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("cost", [cpu_like, flat_cpu, gpu_like])
def test_a_lone_adaptive_sequence_decides_its_own_depth_and_never_loses(alpha, cost):
    """One sequence with adaptive depths: the batch budget steps aside (nothing to trade against) and the
    sequence's controller sizes its drafts, never slower than plain and drafting where that pays."""
    spec = simulate(1, alpha, cost, adaptive=True)
    assert spec >= 0.97 / cost(1), (spec, 1 / cost(1))
    if alpha == 0.8 and cost is not cpu_like:
        assert spec > 1.5 / cost(1)
    policy = SpeculationPolicy(PolicyConfig(adaptive=True, load_aware=True))
    for key in "ab":
        policy.add(key)
    policy.allocate(["a"], [DraftTree.chain([1, 2])], [False])
    assert policy.batch.alone and policy.cap() == NO_CAP
    policy.allocate(["a", "b"], [DraftTree.chain([1, 2])] * 2, [False, False])
    assert not policy.batch.alone


def test_speculates_when_it_pays():
    assert simulate(1, 0.9, cpu_like) > 1.5 / cpu_like(1)  # CPU, one user, drafts nearly always right
    assert simulate(8, 0.8, gpu_like) > 2.5 * 8 / gpu_like(8)  # memory-bound batch: verifying is ~free


@pytest.mark.parametrize("seed", range(4))
def test_flat_verify_keeps_drafting_at_low_acceptance(seed):
    """A verify as cheap as one token makes even 0.3 acceptance pay (~1.4x at the best fixed depth). A probe
    is judged by its expected tokens over its measured cost: judged by the tokens one step happened to
    draw (nothing accepted 70% of the time) it backed probing off for good after a bad streak (1.03x)."""
    spec = simulate(1, 0.3, flat_cpu, seed=seed)
    assert spec >= 1.2 / flat_cpu(1), spec * flat_cpu(1)


def test_no_drafting_under_compute_bound_load():
    budget = SpeculationPolicy(PolicyConfig(max_depth=4, adaptive=False))
    keys = [str(i) for i in range(32)]
    for k in keys:
        budget.add(k)
    for _ in range(50):
        trees = [DraftTree.chain([1] * budget.plan(k, 4).depth) for k in keys]
        trees = budget.allocate(keys, trees, [False] * len(keys))
        budget.record(keys, trees, [FakeStep([0], 0, t.num_nodes) for t in trees], cpu_like(32 * (1 + trees[0].num_nodes)))
    assert budget.cap() == 0 and budget.plan("0", 4).depth == 0  # drafters are told not to draft
    assert budget.batch.probe_interval > BudgetConfig().min_probe_interval  # failed probes back off


def test_disabled_passes_trees_through():
    budget = SpeculationPolicy(PolicyConfig(load_aware=False))
    budget.add("a")
    tree = DraftTree.chain([5, 6, 7])
    assert budget.allocate(["a"], [tree], [False]) == [tree] and budget.announce("a") == NO_CAP


def test_sampled_trees_are_cut_only_to_the_budget_planned_before_drafting():
    """A sampled tree's shape may depend on its tokens: the cut ignores its shape and keeps the first
    `planned` nodes (draw order); a deterministic tree in the same batch is cut by likelihood."""
    budget = SpeculationPolicy(PolicyConfig(adaptive=False, budget=BudgetConfig(probe_tokens=1)))
    budget.add("s")
    budget.add("d")
    budget.batch.costs.record(2, 0.05)  # measured: one row each is cheap, more rows are dear
    budget.batch.costs.record(4, 0.50)
    budget.batch.last_budget, budget.batch.num_choices = 1, 1  # as if the last step chose 1 node
    planned = budget.plan("s", 8)
    assert planned.max_nodes == 2  # last budget + 1
    q = torch.full((4, 5), 0.2)
    sampled = DraftTree((1, 2, 3, 4), (-1, -1, 0, 0), q)  # four nodes drafted: two more than planned
    greedy = DraftTree((1, 2, 3, 4), (-1, 0, -1, 1))
    cut_s, cut_d = budget.allocate(["s", "d"], [sampled, greedy], [True, False])
    assert cut_s.token_ids == (1, 2) and cut_s.parent_ids == (-1, -1) and torch.equal(cut_s.q, q[:2])
    assert cut_d.num_nodes <= 1  # the batch's choice: verifying more rows does not pay here


def simulate_depth(accept_all: bool, steps: int = 400, max_depth: int = 8):
    """Returns (time with speculation, time of plain decoding) for the same number of emitted tokens."""
    controller = DepthController(DepthConfig(max_depth=max_depth))
    elapsed, emitted, ks = 0.0, 0, []
    for _ in range(steps):
        k = controller.depth()
        ks.append(k)
        cost = T_PLAIN + (T_EXTRA + k * T_DRAFT if k else 0.0)
        accepted = k if accept_all else 0
        controller.record(k, accepted, cost)
        elapsed += cost
        emitted += accepted + 1
    return elapsed, emitted * T_PLAIN, ks


def test_always_wrong_drafts_cost_at_most_ten_percent():
    spec, plain, ks = simulate_depth(accept_all=False)
    assert spec <= 1.10 * plain
    assert sum(1 for k in ks[-200:] if k) <= 200 / 16  # only occasional probes late on


def test_always_right_drafts_use_the_maximum():
    spec, plain, ks = simulate_depth(accept_all=True)
    assert ks[-1] == 8
    assert spec < plain / 3


def test_not_adaptive_always_drafts_maximum():
    controller = DepthController(DepthConfig(max_depth=5, adaptive=False))
    controller.record(5, 0, 1.0)
    assert controller.depth() == 5


def test_trim_keeps_parents_and_earlier_siblings():
    # root -> 0, 1, 2 (siblings); 0 -> 3 -> 5; 1 -> 4
    tree = DraftTree((10, 11, 12, 13, 14, 15), (-1, -1, -1, 0, 1, 3), torch.eye(6, 20))
    order = node_order(tree, 0.6)
    for r in range(tree.num_nodes + 1):
        kept = {i for i, _ in order[:r]}
        for i in kept:
            parent = tree.parent_ids[i]
            assert parent < 0 or parent in kept
            assert all(j in kept for j in range(i) if tree.parent_ids[j] == parent)  # earlier siblings
        sub = keep_nodes(tree, sorted(kept))
        sub.validate(20, 64)
        tree_layout(sub.parent_ids)
        for n, node in enumerate(sorted(kept)):  # tokens and q rows travel with their node
            assert sub.token_ids[n] == tree.token_ids[node] and torch.equal(sub.q[n], tree.q[node])
    assert [i for i, _ in order[:3]] == [0, 3, 1]  # alpha 0.6: first path deeper before a second sibling


def test_cost_table_interpolates_and_extrapolates():
    table = CostTable(decay=0.5)
    table.record(2, 0.10)
    table.record(6, 0.30)
    assert table.estimate(4) == pytest.approx(0.20)
    assert table.estimate(10) == pytest.approx(0.50)  # the line through the two largest
    assert table.estimate(1) == pytest.approx(0.05)  # below: proportional
    table.record(2, 0.20)
    assert table.estimate(2) == pytest.approx(0.15)  # decayed mean


def test_cost_table_never_prices_fewer_rows_above_more():
    """A count first measured during a stall (9 rows: 85 ms) is bounded by a larger count's cost, so
    the policy still picks it and measures it again, which brings its mean down."""
    table = CostTable(decay=0.9)
    table.record(1, 0.020)
    table.record(9, 0.085)
    assert table.estimate(9) == pytest.approx(0.085)  # nothing larger measured yet
    table.record(17, 0.028)
    assert table.estimate(9) == pytest.approx(0.028)
    assert table.estimate(5) == pytest.approx(0.028)  # between 1 and 9 the line would say 0.0525
    assert table.estimate(1) == pytest.approx(0.020)
    assert table.estimate(20) > 0.028


@pytest.mark.parametrize("min_gain, expected", [(1.0, 1), (1.1, 0)])
def test_drafting_must_promise_min_gain_over_plain(min_gain, expected):
    """Measured: 4 rows cost 1.0, 8 rows 1.5; four sequences at alpha 0.6 expect 4 + 4 * 0.6 = 6.4 tokens
    from one node each: 4.27 tokens/s against plain's 4.0, a 1.07x gain the forward's time alone shows,
    within what the costs it does not show (drafts sent and received, a drafter process on the same
    cores) can take back. With min_gain 1.1 the step stays plain; trusting the model exactly, it drafts."""
    budget = SpeculationPolicy(PolicyConfig(adaptive=False, budget=BudgetConfig(
        costs=((4, 1.0), (8, 1.5), (12, 3.0)), learn_costs=False, min_gain=min_gain, max_probe_interval=1 << 20,
        min_probe_interval=1 << 20)))
    keys = list("abcd")
    for k in keys:
        budget.add(k)
        budget.seqs[k].acceptance.accepted, budget.seqs[k].acceptance.rejections = 60.0, 40.0  # alpha 0.6
    trees = budget.allocate(keys, [DraftTree.chain([1, 2]) for _ in keys], [False] * 4)
    assert [t.num_nodes for t in trees] == [expected] * 4


def test_depth_learns_that_a_flat_verify_is_nearly_free():
    """specdec's kernels: a verify of 9 rows costs ~3% more than one row. The fitted step cost must learn
    that (a and b small) and draft deep when drafts pass, shallow when they seldom do."""
    def run(alpha: float) -> tuple[DepthController, list[int]]:
        rng, controller, ks = random.Random(0), DepthController(DepthConfig()), []
        for _ in range(300):
            k = controller.depth()
            accepted = 0
            while accepted < k and rng.random() < alpha:
                accepted += 1
            controller.record(k, accepted, flat_cpu(k + 1) + 0.0001 * k)  # + 0.1 ms a drafted token
            ks.append(k)
        return controller, ks[-100:]

    controller, late = run(0.8)
    # True extra cost: 0.45 ms of verify + 0.7 ms of drafting. The fit says ~5 ms: the depth sits at 7-8,
    # where 9 rows cross the kernels' knee, and a line clamped to a >= 0 keeps that steep slope. Still far
    # below the old verify's 1.1-2x a step, which is what decides the depth here.
    extra = controller.step_cost(7) - controller.t_plain
    assert 0.0 <= extra < 0.5 * controller.t_plain, extra
    assert sum(late) / len(late) >= 6
    _, late = run(0.3)
    assert 1.5 <= sum(late) / len(late) <= 5  # ~0.3: the best rate is at depth 2-3, deeper adds ~nothing


def test_a_drafted_steps_cost_includes_getting_its_drafts():
    """The batch budget's cost of a step that verifies drafts is the forward plus the drafting and the
    wait for drafts before it; a plain step's is its forward alone (nothing was drafted for it)."""
    policy = SpeculationPolicy(PolicyConfig(adaptive=False))
    policy.add("a")
    policy.record(["a"], [DraftTree.chain([1, 2])], [FakeStep([0, 0], 1, 2)], 0.014, draft_s=0.002, wait_s=0.005)
    policy.record(["a"], [DraftTree.empty()], [FakeStep([0], 0, 0)], 0.013, draft_s=0.001, wait_s=0.004)
    assert policy.batch.costs.means == {3: pytest.approx(0.021), 1: pytest.approx(0.013)}


def test_a_probe_that_got_no_drafts_is_neither_judged_nor_dropped():
    """Under load the budget is 0 but for probes. The commit before a probe step announces the probe's
    budget (the draft worker drafts for it at once); a probe step whose drafts did not come (the draft
    worker restarting, or slow) verified nothing, so it says nothing about costs: the interval does not
    back off and the probe stays due until a step brings drafts, which is then judged."""
    budget = SpeculationPolicy(PolicyConfig(max_depth=4, adaptive=False))
    keys = [str(i) for i in range(32)]
    for k in keys:
        budget.add(k)

    def step(drafted: bool) -> None:
        trees = [DraftTree.chain([1] * (budget.plan(k, 4).depth if drafted else 0)) for k in keys]
        trees = budget.allocate(keys, trees, [False] * len(keys))
        budget.record(keys, trees, [FakeStep([0], 0, t.num_nodes) for t in trees], cpu_like(32 * (1 + trees[0].num_nodes)))

    while budget.cap() != 0:  # learn that drafting does not pay at this load
        step(True)
    while budget.cap() == 0:  # plain steps until the one before a probe
        step(True)
    batch = budget.batch
    assert batch.steps_since_probe + 1 >= batch.probe_interval and budget.cap() > 0  # announced a step ahead
    interval = batch.probe_interval
    for _ in range(3):  # the probe steps get no drafts: nothing judged, the probe still due
        step(False)
        assert batch.probe_interval == interval and budget.cap() > 0
    step(True)  # drafts came: the probe is judged (under this load it fails and backs off)
    assert batch.probe_interval > interval and batch.steps_since_probe == 0


def test_measured_costs_seed_the_batch_budget(tiny_target, one_thread):
    """forward_costs times warm forwards over a scratch cache; a load-aware policy starts from them."""
    from specdec import Engine
    from specdec.policy.calibrate import forward_costs

    engine = Engine.from_pretrained(target=tiny_target)
    costs = forward_costs(engine.runner, row_counts=(1, 3, 9), cached=16, repeats=1)
    assert [rows for rows, _ in costs] == [1, 3, 9] and all(seconds > 0 for _, seconds in costs)
    policy = engine.new_policy(load_aware=True, costs=costs)
    assert policy.batch.costs.means == dict(costs) and policy.cap() == NO_CAP  # known costs: no first probe
    assert engine.new_policy(load_aware=True).batch.costs.means == {}


def test_an_engines_policy_prices_batches_as_its_runner_verifies_them(tiny_target):
    """The engine's policies (the in-process step's and the target worker's alike) are ragged exactly
    where the runner's verify forwards are: on the lean walk with a static cache, unless turned off."""
    import dataclasses

    from specdec import Engine

    engine = Engine.from_pretrained(target=tiny_target)
    assert engine.runner.ragged and engine.new_policy().ragged
    engine.runner.run_config = dataclasses.replace(engine.runner.run_config, ragged=False)
    assert not engine.runner.ragged and not engine.new_policy().ragged
    dynamic = Engine.from_pretrained(target=tiny_target, kv_cache="dynamic")
    assert not dynamic.runner.ragged and not dynamic.new_policy().ragged


def test_costs_are_kept_per_batch_size():
    """8 padded rows are 8 sequences' plain step or 4 sequences' drafted one: the budget must price each by
    its own batch size's measurements, and shape a batch size's unmeasured counts by the all-batch table."""
    budget = SpeculationPolicy(PolicyConfig(adaptive=False)).batch
    budget.record(8, 0.020, 6, batch=4)  # 4 sequences x 2 rows, drafting included
    budget.record(8, 0.014, 8, batch=8)  # 8 sequences x 1 row, plain
    budget.record(16, 0.024, 8, batch=4)
    assert budget.estimate(8, 8) == pytest.approx(0.014)
    assert budget.estimate(4, 8) == pytest.approx(0.020)
    assert budget.estimate(4, 12) == pytest.approx(0.022)  # between the batch's own counts
    assert budget.estimate(2, 8) == pytest.approx(budget.costs.estimate(8))  # never measured: all batches
    # above batch 8's only count: its 8-row cost times the all-batch table's 16 / 8 ratio
    assert budget.estimate(8, 16) == pytest.approx(0.014 * budget.costs.estimate(16) / budget.costs.estimate(8))


def test_a_policy_continues_from_the_costs_an_earlier_one_measured():
    """The engine's next generation or batch run starts from the verify costs the last one measured (copied,
    per batch size too), not from an empty table that its first steps must measure again; acceptance is not
    carried, and a budget that does not learn costs (pinned) keeps only its own."""
    earlier = SpeculationPolicy(PolicyConfig(adaptive=False))
    earlier.batch.record(8, 0.014, 8, batch=8)
    earlier.batch.record(16, 0.024, 12, batch=8)
    earlier.pool.record(8, 2, decay=0.9)  # a poor acceptance
    later = SpeculationPolicy(PolicyConfig(adaptive=False)).continue_from(earlier)
    assert later.batch.costs.means == earlier.batch.costs.means
    assert later.batch.estimate(8, 16) == pytest.approx(0.024)
    assert later.cap() == NO_CAP  # known costs: no short first draft to measure one
    later.batch.record(8, 0.030, 8, batch=8)
    assert earlier.batch.estimate(8, 8) == pytest.approx(0.014)  # copies: the earlier table is untouched
    assert later.pool.alpha == SpeculationPolicy().pool.alpha != earlier.pool.alpha
    pinned = SpeculationPolicy(PolicyConfig(budget=BudgetConfig(costs=((8, 0.01),), learn_costs=False)))
    assert pinned.continue_from(earlier).batch.costs.means == {8: 0.01}


def test_generate_batch_continues_from_the_engines_last_run(tiny_target, one_thread):
    """In process, each generate_batch call makes a policy: it starts from the costs the engine's last run
    measured and leaves its own for the next."""
    from specdec import Engine, SamplingParams
    from specdec.batch import generate_batch

    engine = Engine.from_pretrained(target=tiny_target, drafter="ngram")
    generate_batch(engine, [[5, 6, 7, 5, 6, 7], [1, 2, 3]], SamplingParams(max_new_tokens=12, ignore_eos=True))
    first = engine.last_policy
    assert first is not None and first.batch.costs.means
    generate_batch(engine, [], SamplingParams(max_new_tokens=12))  # no step: only what it started from
    assert engine.last_policy is not first and engine.last_policy.batch.costs.means == first.batch.costs.means


def test_an_unverified_sequences_acceptance_regains_the_prior():
    """Ragged, a sequence with no node verified this step keeps 0.95 of its evidence and takes the rest
    from the worker's prior: an early run of rejections fades instead of ranking it last for good. Padded,
    every tree gets R nodes, and a tree without any has nothing to regain from."""
    steps = [FakeStep([0], 0, 0), FakeStep([0] * 5, 4, 4), FakeStep([0] * 5, 4, 4)]
    trees = [DraftTree.empty(), DraftTree.chain([1, 2, 3, 4]), DraftTree.chain([1, 2, 3, 4])]
    for ragged in (True, False):
        policy = SpeculationPolicy(PolicyConfig(max_depth=4, adaptive=False), ragged=ragged)
        for key in "abc":
            policy.add(key)
        for _ in range(20):  # "a" rejected at once every step; "b" and "c" accept everything
            policy.observe("a", 4, 0, None)
            for key in "bc":
                policy.observe(key, 4, 4, None)
        low = policy.alpha("a")
        policy.record(list("abc"), trees, steps, 0.02)
        if ragged:
            assert low < policy.alpha("a") < policy.pool.alpha  # toward the prior, not there at once
        else:
            assert policy.alpha("a") == low
