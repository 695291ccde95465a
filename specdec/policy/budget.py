"""The batch's node budget: how many draft nodes each sequence gets verified in one forward.

Speculation pays when a forward is bound by reading the weights: one extra row is almost free. At
high load the forward is already bound by compute, every extra row costs, and drafting makes the
system slower than plain batched decoding. So the step that verifies a batch decides, from measured
costs and measured acceptance, how many nodes per sequence to verify:

    rows per sequence   R + 1             the batch is padded to its longest tree (specdec.step), so
                                          every sequence gets the same node budget R (0 = plain step)
    cost                t(B, B * (R + 1)) seconds of one verify forward over B sequences, measured:
                                          decayed mean per (batch size, padded row count), interpolated
                                          between a batch's measured counts; outside them anchored on its
                                          nearest one and shaped by the all-batch table (per row count,
                                          extrapolated pessimistically above its largest)
    gain                B + sum_i sum_{node kept} P_i(node)
    P_i(node)           P_i(parent) * alpha_i * (1 - alpha_i)^rank   (rank among its siblings)
    choice              R maximising gain / cost, and R = 0 unless that beats R = 0 by min_gain

Where the forward computes each sequence's own rows only (ragged: specdec's lean walk on a CPU), a
step costs t(B, B + k) for k nodes in all, wherever they are, so `choose_each` keeps the k most likely
nodes of all the trees together instead: a sequence whose draft is nearly certain verifies it whole
while the others decode plainly, where a uniform R would pay its rows for every sequence.

Costs above the measured row counts are unknown, so every `probe_interval` steps one step verifies
`probe_tokens` more per sequence (one in batches of 4 or more) and measures it; a probe whose expected
tokens over its measured seconds did not beat the choice's expected rate doubles the interval, so under
load probing costs well under a percent.

Which trees may be cut after drafting is the exactness question, answered in specdec.policy.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdec.core.tree import DraftTree, node_depths
from specdec.policy.cost_table import CostTable

NO_CAP = 1 << 16  # "no node limit": the sequence's own depth choice decides


@dataclass(frozen=True)
class BudgetConfig:
    enabled: bool = True
    decay: float = 0.9  # weight of history in cost means
    probe_tokens: int = 2
    min_probe_interval: int = 8
    max_probe_interval: int = 256
    # (padded rows, seconds) known before any step, e.g. measured offline; with learn_costs False they
    # are all there is, which makes the budget deterministic (tests, simulations, pinned deployments)
    costs: tuple[tuple[int, float], ...] = ()
    learn_costs: bool = True
    first_budget: int | None = None  # nodes of the first step (None: probe_tokens, or no cap if costs are given)
    # Draft only where the model promises at least this much over not drafting: a speculative step has
    # costs the forward's time does not show (drafts sent and received, a drafter process sharing the
    # cores), and near the break-even point timing noise decides. 1.0 = trust the model exactly.
    min_gain: float = 1.1
    # Ragged batches (choose_each): a sequence that has had no draft node verified for this many steps gets
    # one. Its acceptance moves only when its drafts are verified, so one that looked poor after an unlucky
    # start would otherwise stay unverified for good (a simulated batch of 8 at acceptance 0.8: two of the
    # eight stuck at 0.31-0.38, 1.18x plain against 1.27x padded).
    explore_interval: int = 32
    # ...and each step it has no node verified, its acceptance estimate keeps this much of its evidence and
    # takes the rest from the worker's prior (depth.Acceptance.regain). Ranked by its own estimate alone, a
    # sequence rejected early sank below the others and seldom rose again: simulated batches of 8 / 16 at
    # acceptance 0.8, 1.18x / 1.02x plain against 1.23x / 1.05x with 0.95 (0.9 lost the mixed batch's gain).
    regain_keep: float = 0.95


class BatchBudget:
    """R for each verify forward, chosen from measured costs; `cap()` is what drafters are told."""

    def __init__(self, config: BudgetConfig = BudgetConfig()):
        self.config = config
        self.costs = CostTable(config.decay)  # per padded row count, every batch size together
        self.costs.means.update(dict(config.costs))
        # per batch size: 8 rows are 8 sequences' plain step or 4 sequences' drafted one, whose costs differ
        # (in process, bf16: ~14 ms against ~20 ms with drafting); one mean for both made plain steps at 8
        # sequences look 1.8x their cost and drafting look cheap against them
        self.batch_costs: dict[int, CostTable] = {}
        self.last_budget = NO_CAP  # R chosen at the last step (NO_CAP: drafts were not cut)
        self.steps_since_probe = 0
        self.probe_interval = config.min_probe_interval
        self.probe_expected: float | None = None  # during a probe step: the expected rate of the choice
        self.probe_gain = 0.0  # ... and the tokens the probed nodes are expected to give
        self.num_choices = 0
        self.alone = False  # the last step was one adaptive sequence's (SpeculationPolicy.allocate): its own choice
        self.chose_each = False  # the last choice was choose_each's (its per-tree counts), not choose's one R

    def continue_from(self, earlier: BatchBudget) -> None:
        """Start from the verify costs an earlier budget measured (copies: the two never share a table). A
        budget starting empty spends its first steps measuring (a short first draft, then probes), which in
        short in-process batch runs, one budget each, was a good part of every run."""
        if not self.config.learn_costs:
            return
        self.costs.means.update(earlier.costs.means)
        for batch, table in earlier.batch_costs.items():
            self.batch_costs.setdefault(batch, CostTable(self.config.decay)).means.update(table.means)

    def cap(self) -> int:
        """Most nodes the next step will verify per sequence (0 = do not draft, NO_CAP = no limit).
        Told to drafters before they draft, so it may depend on the past only."""
        if not self.config.enabled or self.alone:  # alone: the sequence's own depth decides
            return NO_CAP
        if self.num_choices == 0:  # a short first draft measures a speculative step
            if self.config.first_budget is not None:
                return self.config.first_budget
            return NO_CAP if self.costs.means else self.config.probe_tokens
        if self.last_budget == NO_CAP:
            return NO_CAP
        if self.steps_since_probe + 1 >= self.probe_interval:
            return self.last_budget + self.config.probe_tokens  # drafts for a probe
        return self.last_budget if self.last_budget == 0 else self.last_budget + 1

    def choose(self, orders: list[list[float]], batch: int) -> int:
        """R for this forward (and, through cap(), the next one). orders: per tree, P(node) most
        likely first. Trees that may not be cut (sampled ones) count as if cut: R is learnt for
        their next budget."""
        max_nodes = max((len(o) for o in orders), default=0)
        self.probe_expected = None
        if not self.config.enabled or max_nodes == 0:
            return NO_CAP
        self.num_choices += 1
        self.chose_each = False
        gains = [float(batch)]  # gains[r]: the batch's expected tokens when every tree keeps its first r nodes
        for r in range(max_nodes):
            gains.append(gains[-1] + sum(order[r] for order in orders if r < len(order)))
        costs = self.estimate_many(batch, [batch * (r + 1) for r in range(max_nodes + 1)])
        best_r, best_rate, plain_rate = _best(gains, costs)
        if plain_rate is not None and best_rate < self.config.min_gain * plain_rate:
            best_r, best_rate = 0, plain_rate
        probe = self.config.probe_tokens if batch < 4 else 1  # a probe costs batch * depth extra rows
        if not self.costs.means:  # nothing measured yet: a short first draft measures a speculative step
            best_r = min(probe, max_nodes)
        elif self.steps_since_probe + 1 >= self.probe_interval and best_r < max_nodes:
            self.probe_expected = best_rate or 0.0
            best_r = min(best_r + probe, max_nodes)
            self.probe_gain = gains[best_r]
        self.last_budget = NO_CAP if best_r >= max_nodes else best_r
        return best_r

    def choose_each(self, orders: list[list[float]], batch: int, explore: list[bool] | None = None) -> list[int]:
        """Nodes to verify of each tree when the forward computes each sequence's own rows (ragged,
        specdec.models.runner.forward_rows): its cost follows the rows in all, batch + k, so the k most
        likely nodes of all the trees together are worth more than R of every tree. k maximises
        (batch + their P) / t(batch, batch + k); orders as choose's (trees that may not be cut take
        choose's one R instead: specdec.policy.allocate). A tree's share is a prefix of its order (ties
        go to the earlier tree, then the earlier node). A probe adds the next most likely nodes, as many
        rows as choose's probe adds. explore[i]: tree i gets a node at least, unjudged (a sequence that has
        had none verified for BudgetConfig.explore_interval steps: specdec.policy.allocate)."""
        ranked = sorted((-p, tree, j) for tree, order in enumerate(orders) for j, p in enumerate(order))
        self.probe_expected = None
        if not self.config.enabled or not ranked:
            return [len(order) for order in orders]
        self.num_choices += 1
        self.chose_each = True
        gains = [float(batch)]
        for p, _, _ in ranked:
            gains.append(gains[-1] - p)
        costs = self.estimate_many(batch, [batch + k for k in range(len(gains))])
        best_k, best_rate, plain_rate = _best(gains, costs)
        # min_gain asks the drafted nodes for it, not the whole batch: their tokens over the seconds they add
        # must beat plain decoding's rate by it. A few sure nodes in a batch of 16 raise the batch's rate by
        # a few percent only, so asked of the whole batch (as choose does) it forbade them at any acceptance.
        if plain_rate is not None and best_k > 0:
            added_s = costs[best_k] - costs[0]
            if added_s > 0 and (gains[best_k] - batch) / added_s < self.config.min_gain * plain_rate:
                best_k, best_rate = 0, plain_rate
        probe = batch * (self.config.probe_tokens if batch < 4 else 1)  # the rows choose's probe adds
        if not self.costs.means:  # nothing measured yet: a short first draft measures a speculative step
            best_k = min(probe, len(ranked))
        elif self.steps_since_probe + 1 >= self.probe_interval and best_k < len(ranked):
            self.probe_expected = best_rate or 0.0
            best_k = min(best_k + probe, len(ranked))
            self.probe_gain = gains[best_k]
        counts = [0] * len(orders)
        for _, tree, _ in ranked[:best_k]:
            counts[tree] += 1
        for tree, due in enumerate(explore or ()):
            if due and orders[tree]:
                counts[tree] = max(counts[tree], 1)
        whole = all(c >= len(order) for c, order in zip(counts, orders))
        self.last_budget = NO_CAP if whole else max(counts)
        return counts

    def estimate_many(self, batch: int, counts: list[int]) -> list[float | None]:
        """estimate(batch, n) of each n in counts, each table sorted once (a ragged choice asks for as
        many counts as the batch has nodes)."""
        own = self.batch_costs.get(batch)
        if own is None or not own.means:
            return self.costs.estimate_many(counts)
        known = sorted(own.means)
        lo, hi = known[0], known[-1]
        mine = own.estimate_many(counts)
        *shapes, at_lo, at_hi = self.costs.estimate_many([*counts, lo, hi])
        out = []
        for n, seconds, shape in zip(counts, mine, shapes):
            anchor, at_anchor = (hi, at_hi) if n > hi else (lo, at_lo)
            if n in own.means or lo < n < hi or shape is None or not at_anchor:
                out.append(seconds)
            else:
                out.append(own.means[anchor] * shape / at_anchor)
        return out

    def estimate(self, batch: int, num_rows: int) -> float | None:
        """Seconds of a forward over `num_rows` padded rows of `batch` sequences: the batch size's own
        measured means where they reach (interpolated between its counts), outside them its nearest
        measured count scaled by the all-batch table's shape, and the all-batch table for a batch size
        never measured."""
        return self.estimate_many(batch, [num_rows])[0]

    def record(self, num_rows: int, seconds: float | None, num_tokens: int, batch: int) -> None:
        """The forward's padded rows, wall seconds (None: not what it costs; a probe then runs again)
        and tokens emitted over the batch."""
        if not self.config.learn_costs:
            return
        if seconds is None:
            self.steps_since_probe += 1
            return
        self.costs.record(num_rows, seconds)
        self.batch_costs.setdefault(batch, CostTable(self.config.decay)).record(num_rows, seconds)
        self.steps_since_probe += 1
        if self.probe_expected is not None:  # at its measured cost, does the probe beat the choice?
            # Judged on expected tokens, not the tokens this one step drew: at acceptance 0.3 a 2-node
            # probe gains nothing 70% of the time, and judging by that luck backed probing off for good
            # while drafting would pay (a flat verify cost: the choice's 1.0x against 1.4x possible).
            paid = self.probe_gain / seconds >= 1.02 * self.probe_expected  # a clear gain, not timing noise
            floor = self.config.min_probe_interval * (4 if batch >= 4 else 1)  # big batches probe rarer
            self.probe_interval = floor if paid else min(max(2 * self.probe_interval, floor),
                                                         self.config.max_probe_interval)
            self.steps_since_probe = 0


def _best(gains: list[float], costs: list[float | None]) -> tuple[int, float | None, float | None]:
    """(the option with the best rate gains[i] / costs[i], that rate, option 0's rate); options whose
    cost is unknown are skipped."""
    best, best_rate, plain_rate = 0, None, None
    for i, (gain, cost) in enumerate(zip(gains, costs)):
        if cost is None or cost <= 0:
            continue
        rate = gain / cost
        plain_rate = rate if i == 0 else plain_rate
        if best_rate is None or rate > best_rate:
            best, best_rate = i, rate
    return best, best_rate, plain_rate


def node_order(tree: DraftTree, alpha: float, scale: float | Callable[[int], float] = 1.0) -> list[tuple[int, float]]:
    """(node, P(node)) most likely first; a node comes after its parent (and, unscored, its earlier
    siblings). P(node): the tree's own scores times `scale` (how far they proved right: one factor, or
    one per depth, scale(depth) with a root's child at depth 1) where it has them, else the chain
    model, alpha for the first child and (1 - alpha) less for each later one. A node is never more
    likely than its parent, so every prefix of the order is a tree."""
    factor = scale if callable(scale) else (lambda depth: scale)
    probs, rank, seen = [], [], {}
    depths = node_depths(tree.parent_ids) if tree.scores is not None else []
    for i, parent in enumerate(tree.parent_ids):
        above = 1.0 if parent < 0 else probs[parent]
        if tree.scores is not None:
            probs.append(min(above, factor(depths[i]) * tree.scores[i]))
            continue
        rank.append(seen.get(parent, 0))
        seen[parent] = rank[-1] + 1
        probs.append(above * alpha * (1 - alpha) ** rank[-1])
    return sorted(enumerate(probs), key=lambda item: (-item[1], item[0]))


def keep_nodes(tree: DraftTree, nodes: list[int]) -> DraftTree:
    """The sub-tree made of `nodes` (closed under parents and earlier siblings), re-indexed."""
    if len(nodes) == tree.num_nodes:
        return tree
    nodes = sorted(nodes)
    index = {node: i for i, node in enumerate(nodes)}
    parents = tuple(-1 if tree.parent_ids[n] < 0 else index[tree.parent_ids[n]] for n in nodes)
    q = tree.q[nodes] if tree.q is not None and nodes else None
    scores = tuple(tree.scores[n] for n in nodes) if tree.scores is not None else None
    return DraftTree(tuple(tree.token_ids[n] for n in nodes), parents, q, scores)
