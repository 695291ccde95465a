"""Exactness of cut sampled trees, by enumeration rather than by sampling.

A scripted bigram drafter (fixed q tables over a 3-token vocabulary) drafts through the real draft-model
session code (width-w trees, expansion by cumulative log q), the real speculation policy cuts the tree
to a forced budget of 3 nodes, and the real verifier judges it against fixed target tables p. Every
random choice goes through `specdec.core.sampling` (sample / accept), so `Enumerate` walks every
outcome with its exact probability: the distribution of the first emitted token must equal p to 1e-9.
The same walk with the cut that main used to make (by likelihood order, after drafting) is off by a
total-variation distance of 0.03 (seed 2), so the test has teeth.
"""
from __future__ import annotations

import pytest
import torch

from specdec.core.tree import tree_layout
from specdec.core.types import SamplingParams
from specdec.core.verify import verify_sampling
from specdec.drafters.draft_model import DraftModelConfig, DraftModelSession
from specdec.policy import PolicyConfig, SpeculationPolicy
from specdec.policy.budget import BudgetConfig
from specdec.policy.depth import Acceptance



def tables(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(q(next | last), p(next | last)) [3, 3] float64 from a fixed seed (the same tables every run)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.softmax(torch.randn(3, 3, generator=g, dtype=torch.float64) * 2, -1)
    return q, torch.softmax(torch.randn(3, 3, generator=g, dtype=torch.float64) * 2, -1)


CONTEXT = [1, 2, 0]
# a budget of 3 nodes from the start; by these costs 3 nodes pay and a 4th costs 100x
FORCED = BudgetConfig(costs=((1, 1.0), (4, 1.0), (5, 100.0)), learn_costs=False, first_budget=3)
PARAMS = SamplingParams(temperature=1.0)


class Path:
    """One run through the draws, following `script` (option index per choice, 0 past its end)."""

    def __init__(self, script: list[int]):
        self.script, self.pos, self.prob, self.num_options = script, 0, 1.0, []

    def _choose(self, options: list[tuple[object, float]]):
        options = [(value, prob) for value, prob in options if prob > 0]
        index = self.script[self.pos] if self.pos < len(self.script) else 0
        self.num_options.append(len(options))
        self.pos += 1
        value, prob = options[index]
        self.prob *= prob
        return value

    def categorical(self, probs: torch.Tensor) -> int:
        return self._choose([(i, float(p)) for i, p in enumerate(probs.tolist())])

    def bernoulli(self, prob: float) -> bool:
        return self._choose([(True, prob), (False, 1.0 - prob)])


def enumerate_paths(run) -> dict:
    """Sum of path probabilities per outcome of run(path), over every path (depth-first, odometer)."""
    totals: dict = {}
    script: list[int] = []
    while True:
        path = Path(list(script))
        outcome = run(path)
        totals[outcome] = totals.get(outcome, 0.0) + path.prob
        counts = path.num_options
        script = list(script) + [0] * (len(counts) - len(script))
        while script and script[-1] + 1 >= counts[len(script) - 1]:
            script.pop()
        if not script:
            return totals
        script[-1] += 1


class BigramRunner:
    """Stands in for a draft model: logits of row i are log q[token fed at row i]."""

    dtype = torch.float32
    device = torch.device("cpu")

    def __init__(self, q: torch.Tensor):
        self.q = q

    class Cache:
        def __init__(self):
            self.length = 0

        def get_seq_length(self) -> int:
            return self.length

        def crop(self, negative: int) -> None:
            self.length += negative

    def new_cache(self):
        return BigramRunner.Cache()

    def forward(self, input_ids, cache, layout=None, attn_bias=None, positions=None, want_logits=True):
        cache.length += len(input_ids)
        return torch.log(self.q[list(input_ids)]), None  # float64 throughout: exact to 1e-9


def first_token_distribution(q: torch.Tensor, p: torch.Tensor, width: int, cut_by_shape: bool) -> torch.Tensor:
    def run(path: Path) -> int:
        policy = SpeculationPolicy(PolicyConfig(max_depth=3, adaptive=False, budget=FORCED))
        policy.add("s")
        policy.seqs["s"].acceptance = Acceptance(7.0, 3.0)  # alpha 0.7
        budget = policy.plan("s", limit=3)
        assert (budget.depth, budget.max_nodes) == (3, 3)
        session = DraftModelSession(BigramRunner(q), DraftModelConfig(tree_width=width))
        # main drafted more than the budget, then cut it by likelihood order (its shape) afterwards;
        # 7 nodes (two levels and the first node of the third) keep the walk short and show the bias
        tree = session.propose(CONTEXT, 3, PARAMS, path, max_nodes=7 if cut_by_shape else budget.max_nodes)
        tree = policy.allocate(["s"], [tree], [not cut_by_shape])[0]
        assert tree.num_nodes <= 3
        layout = tree_layout(tree.parent_ids)
        rows = [CONTEXT[-1], *tree.token_ids]
        probs = p[rows]  # [rows, vocab] the target's p at every verify row
        return verify_sampling(tree, layout, probs, path).token_ids[0]

    totals = enumerate_paths(run)
    return torch.tensor([totals.get(t, 0.0) for t in range(3)], dtype=torch.float64)


@pytest.mark.parametrize("seed", [2, 31])
@pytest.mark.parametrize("width", [2, 3])
def test_cut_sampled_trees_keep_p_exactly(seed, width):
    q, p = tables(seed)
    dist = first_token_distribution(q, p, width, cut_by_shape=False)
    assert torch.allclose(dist, p[CONTEXT[-1]], atol=1e-9, rtol=0), dist


def test_cutting_by_shape_after_drafting_is_biased():
    q, p = tables(2)
    dist = first_token_distribution(q, p, 2, cut_by_shape=True)
    total_variation = 0.5 * float((dist - p[CONTEXT[-1]]).abs().sum())
    assert abs(float(dist.sum()) - 1.0) < 1e-9
    assert total_variation > 0.02, total_variation  # measured: 0.030
