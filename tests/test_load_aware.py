"""Load-aware speculation: trimming keeps valid trees, and on simulated cost curves the policy
speculates where it pays (low load) and falls back to plain steps where it does not (high load)."""
import random
from dataclasses import dataclass

import pytest
import torch

from specdec.core.tree import DraftTree, tree_layout
from specdec.load_aware import NO_CAP, CostTable, LoadAwareBudget, LoadAwareConfig, _keep


@dataclass
class FakeStep:
    token_ids: list
    num_accepted: int
    depth: int


def simulate(batch: int, alpha: float, cost, num_steps: int = 400, enabled: bool = True, seed: int = 0) -> float:
    """Tokens per second of `batch` sequences drafting 8-token chains accepted token by token with
    probability alpha; cost(rows) = seconds of a verify forward over that many padded rows."""
    rng = random.Random(seed)
    budget = LoadAwareBudget(LoadAwareConfig(enabled=enabled))
    keys = [str(i) for i in range(batch)]
    for k in keys:
        budget.add(k)
    tokens = seconds = 0.0
    for _ in range(num_steps):
        trees = [DraftTree.chain([1] * min(8, budget.hint(k))) for k in keys]
        trees = budget.allocate(keys, trees)
        steps = []
        for tree in trees:
            accepted = 0
            while accepted < tree.num_nodes and rng.random() < alpha:
                accepted += 1
            steps.append(FakeStep([0] * (accepted + 1), accepted, tree.num_nodes))
        rows = batch * (1 + max(t.num_nodes for t in trees))
        step_s = cost(rows)
        budget.record(keys, trees, steps, step_s)
        tokens += sum(len(s.token_ids) for s in steps)
        seconds += step_s
    return tokens / seconds


def cpu_like(rows: int) -> float:
    """This machine's shape: 1 row 53 ms, 2-16 rows ~100-130 ms, then compute-bound ~8 ms a row."""
    return 0.053 if rows == 1 else 0.1 + 0.002 * rows if rows <= 16 else 0.13 + 0.008 * (rows - 16)


def gpu_like(rows: int) -> float:
    """Memory-bound until ~64 rows, then linear in rows."""
    return 0.02 + 0.0005 * max(rows - 64, 0)


@pytest.mark.parametrize("batch", [1, 2, 4, 8, 16, 32])
@pytest.mark.parametrize("alpha", [0.1, 0.5, 0.8])
@pytest.mark.parametrize("cost", [cpu_like, gpu_like])
def test_never_slower_than_plain(batch, alpha, cost):
    plain = batch / cost(batch)
    spec = simulate(batch, alpha, cost)
    assert spec >= 0.97 * plain, (spec, plain)


def test_speculates_when_it_pays():
    assert simulate(1, 0.9, cpu_like) > 1.5 / cpu_like(1)  # CPU, one user, drafts nearly always right
    assert simulate(8, 0.8, gpu_like) > 2.5 * 8 / gpu_like(8)  # memory-bound batch: verifying is ~free


def test_no_drafting_under_compute_bound_load():
    budget = LoadAwareBudget()
    keys = [str(i) for i in range(32)]
    for k in keys:
        budget.add(k)
    for _ in range(50):
        trees = budget.allocate(keys, [DraftTree.chain([1] * min(4, budget.hint(k))) for k in keys])
        budget.record(keys, trees, [FakeStep([0], 0, t.num_nodes) for t in trees], cpu_like(32 * (1 + trees[0].num_nodes)))
    assert budget.hint("0") == 0  # drafters are told not to draft
    assert budget.probe_interval > LoadAwareConfig().min_probe_interval  # failed probes back off


def test_disabled_passes_trees_through():
    budget = LoadAwareBudget(LoadAwareConfig(enabled=False))
    tree = DraftTree.chain([5, 6, 7])
    assert budget.allocate(["a"], [tree]) == [tree] and budget.hint("a") == NO_CAP


def test_trim_keeps_parents_and_earlier_siblings():
    # root -> 0, 1, 2 (siblings); 0 -> 3 -> 5; 1 -> 4
    tree = DraftTree((10, 11, 12, 13, 14, 15), (-1, -1, -1, 0, 1, 3), torch.eye(6, 20))
    order = LoadAwareBudget._node_order(tree, 0.6)
    for r in range(tree.num_nodes + 1):
        kept = {i for i, _ in order[:r]}
        for i in kept:
            parent = tree.parent_ids[i]
            assert parent < 0 or parent in kept
            assert all(j in kept for j in range(i) if tree.parent_ids[j] == parent)  # earlier siblings
        sub = _keep(tree, sorted(kept))
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
