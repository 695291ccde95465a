"""One sequence's speculation state: its acceptance estimate and its own choice of draft depth.

Acceptance (chain view): each draft token is accepted with probability alpha, independently, until
the first rejection. alpha = accepted / (accepted + rejections), the maximum-likelihood estimate for
a truncated geometric, over exponentially decayed counts. This one estimate serves both the depth
choice below and the batch node budget (specdec.policy.budget), so the two never disagree.

Depth choice: drafting k gives E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) per step. A step costs
t_plain for k = 0 and t_plain + a + b * k otherwise: `a` is the verify forward's fixed extra cost over
a one-token forward (large on CPUs) and `b` the per-token cost of drafting and verifying, both fitted
online by decayed least squares. We pick k in [0, max_depth] maximising E[tokens] / cost. When k = 0
wins we still probe with a short draft now and then, backing off while probes fail, so a prompt whose
drafts are always wrong costs only the probes. Everything here depends on the past only.

Scored drafts. One alpha says little about a drafter whose guesses are sometimes sure and sometimes
not: suffix decoding follows a 30-token verbatim copy and, on the next step, a one-token coincidence.
Such a drafter scores its own nodes (DraftTree.scores: the probability of each node's path), drafts
the whole depth, and the controller keeps the nodes worth their cost: the r most likely, r maximising
(1 + sum of their calibrated scores) / step cost of r nodes. That cost is read from a table of
measured step seconds per verified row count (specdec.policy.budget.CostTable, as the batch budget
keeps), not from the line in k: a tree's cost follows its rows, which on CPUs is flat and then
steep, and a line through wide trees' costs makes one node look as dear as the average one. The
scores are calibrated against what was accepted, depth by depth (accepted tokens over the tokens the
verified nodes' scores promised at that depth, decayed: Calibration), so overconfident scores lose
their say, and r = 0 (a plain step) is probed like k = 0 above. Deciding after drafting is sound: such trees are
deterministic (specdec.policy: cut freely), and such drafters cheap (discarding a draft costs little).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from specdec.core.tree import node_depths
from specdec.policy.cost_table import CostTable


@dataclass(frozen=True)
class DepthConfig:
    max_depth: int = 8
    adaptive: bool = True  # False: always draft max_depth
    decay: float = 0.9  # weight of history in counts and timing fits
    probe_tokens: int = 2
    min_probe_interval: int = 4
    max_probe_interval: int = 64


@dataclass
class Acceptance:
    """Decayed counts of accepted draft tokens and of rejections (a step that stopped short)."""

    accepted: float = 1.0
    rejections: float = 1.0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    def record(self, depth: int, num_accepted: int, decay: float) -> None:
        """A step that drafted `depth` deep (> 0) and accepted num_accepted <= depth of them."""
        self.accepted = decay * self.accepted + num_accepted
        self.rejections = decay * self.rejections + (1.0 if num_accepted < depth else 0.0)

    def regain(self, prior: Acceptance, keep: float) -> None:
        """One step without a verified draft: the evidence fades toward `prior` (its counts, weighted 1 - keep)."""
        self.accepted = keep * self.accepted + (1.0 - keep) * prior.accepted
        self.rejections = keep * self.rejections + (1.0 - keep) * prior.rejections

    def prior(self, weight: float = 2.0) -> Acceptance:
        """A new sequence's start: this estimate's mean, worth `weight` pseudo-steps."""
        total = self.accepted + self.rejections
        return Acceptance(weight * self.accepted / total, weight * self.rejections / total)


# The calibration's neutral start, worth this many promised tokens (decayed with the evidence, like it). 16
# rather than 4 (about one wide tree's promise): a few early breaks of a copy then move a depth's scale less.
# Offline replay of the workloads with this host's row costs: JSON tau 2.85 -> 2.99, modelled 2.42x -> 2.47x,
# code and RAG +0.03x, agent and summarization unchanged; live, suffix JSON tau 2.99 / 3.04 against 2.92-2.99,
# Spec-Bench and the hybrid at one user unchanged within their spread.
PRIOR_TOKENS = 16.0
# The weight a depth's prior regains, step by step, while no node at that depth is verified (Calibration).
# Replayed with this host's row costs (benchmarks/suffix_trace.py --adaptive): suffix decoding's JSON tau
# 2.99 -> 3.15, modelled 2.47x -> 2.49x, the other workloads within 0.002x; 4 gave tau 3.11, 12 and 16 3.15
# at 0.005x and 0.02x less JSON speed. A floor under every depth's prior (never below 4-6 tokens) raised
# JSON tau as far, but kept scores that are never right drafting (test_policy_scored's overconfident test).
REGAIN_TOKENS = 8.0


@dataclass
class Calibration:
    """How far a drafter's own scores proved right, depth by depth: at each depth of the verified
    trees, decayed accepted tokens (the accepted path holds one node at every depth it reaches) over
    the tokens their nodes' scores promised there (their sum: the expected accepted count at that
    depth). Depth by depth because a drafter is wrong differently there: suffix decoding scores
    every node of a single earlier occurrence's continuation as sure as its first, so a 16-node copy
    promises 8 tokens at 0.5 each and mostly breaks early. One scale over all depths then fell to
    0.1-0.2 on JSON answers and cut the shallow, branching trees that paid (the workload bench drafted
    faster with the policy off); per depth, the deep nodes lose their say and the shallow ones keep it.

    A depth with little evidence leans on the one above it: its prior is the shallower depth's scale,
    worth `weights[depth - 1]` promised tokens; depth 1's is `neutral` (1.0: as scored). A depth's
    prior starts at `weight` (PRIOR_TOKENS) and decays with the evidence at that depth, so scores that
    are never right lose their say entirely. A step that verifies no node at a depth brings it no
    evidence: there the prior regains weight instead, toward REGAIN_TOKENS, while the old evidence
    decays. Otherwise a depth whose scale fell stayed cut for good: its nodes were no longer
    verified, nothing moved its ratio again, and a later verbatim copy was verified 2-5 nodes deep
    when its whole 16-node chain was right (suffix decoding on JSON: deep scales frozen at 0.02-0.07)."""

    neutral: float = 1.0
    weight: float = PRIOR_TOKENS  # a depth's prior weight until it is first verified
    accepted: list[float] = field(default_factory=list)  # [depth - 1]: decayed accepted tokens there
    promised: list[float] = field(default_factory=list)  # [depth - 1]: decayed promised tokens there
    weights: list[float] = field(default_factory=list)  # [depth - 1]: the prior's weight there
    scales: list[float] | None = None  # [depth - 1]: scale_at's answers, worked out once after each record

    def scale_at(self, depth: int) -> float:
        """The factor for a node's score at `depth` (>= 1); below the deepest depth seen, the deepest's."""
        if self.scales is None:
            scale, self.scales = self.neutral, []
            for accepted, promised, weight in zip(self.accepted, self.promised, self.weights):
                if promised + weight > 1e-9:
                    scale = (accepted + weight * scale) / (promised + weight)
                self.scales.append(scale)
        return self.scales[min(depth, len(self.scales)) - 1] if self.scales else self.neutral

    def record(self, scores, parent_ids, num_accepted: int, decay: float) -> None:
        """One verified scored tree (its nodes' scores and parents) and the tokens it had accepted."""
        depths = node_depths(parent_ids)
        deepest = max(depths, default=0)
        while len(self.accepted) < deepest:
            self.accepted.append(0.0)
            self.promised.append(0.0)
            self.weights.append(self.weight)
        self.accepted[:] = [decay * a for a in self.accepted]
        self.promised[:] = [decay * p for p in self.promised]
        verified = set(depths)
        self.weights[:] = [decay * w if d in verified else decay * w + (1 - decay) * REGAIN_TOKENS
                           for d, w in enumerate(self.weights, 1)]
        for depth, score in zip(depths, scores):
            self.promised[depth - 1] += score
        for d in range(min(num_accepted, deepest)):
            self.accepted[d] += 1.0
        self.scales = None

    def prior(self) -> Calibration:
        """A new sequence's start: this calibration's scale as its neutral point, without its evidence
        (the depths' shape is relearnt: a new prompt copies more or less than the last one)."""
        return Calibration(self.scale_at(1))


@dataclass
class DepthController:
    config: DepthConfig
    acceptance: Acceptance = field(default_factory=Acceptance)
    t_plain: float | None = None
    fit: list[float] = field(default_factory=lambda: [0.0] * 5)  # decayed n, sum k, sum k^2, sum y, sum k y
    steps_since_spec: int = 0
    probe_interval: int = 0
    calibration: Calibration = field(default_factory=Calibration)
    row_costs: CostTable | None = None  # scored steps: seconds per verified row count (root included)
    guessed_rows: set[int] = field(default_factory=set)  # row counts whose cost came from an earlier sequence
    probe_gain: float | None = None  # a scored probe's expected tokens (1 + its nodes' probabilities)

    def __post_init__(self) -> None:
        self.probe_interval = self.probe_interval or self.config.min_probe_interval

    @property
    def alpha(self) -> float:
        return self.acceptance.alpha

    def step_cost(self, k: int) -> float:
        if k == 0:
            return self.t_plain
        n, sk, skk, sy, sky = self.fit
        det = n * skk - sk * sk
        b = max((n * sky - sk * sy) / det, 0.0) if det > 1e-9 * max(n * skk, 1e-30) else 0.0
        a = max((sy - b * sk) / n, 0.0)
        return self.t_plain + a + b * k

    def expected_rate(self, k: int) -> float:
        alpha = min(self.alpha, 0.999)
        return (1 - alpha ** (k + 1)) / (1 - alpha) / self.step_cost(k)

    def carry_over(self, config: DepthConfig, acceptance: Acceptance) -> DepthController:
        """A new sequence's controller that starts from this one's plain step time (the machine's,
        not the sequence's: no plain step to measure it again), its calibration as a prior worth
        PRIOR_TOKENS, and its row costs as first guesses; config and acceptance: the new sequence's.

        The line fitted to speculative steps is not carried: measured under a passing load spike it
        can say drafting never pays, and then only rare probes correct it, in every later sequence
        too (prompt lookup in the workload bench stopped drafting so). Row costs this sequence
        measured itself are carried as guesses, each replaced outright by the new sequence's first
        step of that size; a guess it never replaced is not passed on, so a cost measured in a
        spike cannot keep trees of its size out of every later sequence."""
        new = DepthController(config, acceptance, self.t_plain, calibration=self.calibration.prior())
        if self.row_costs is not None:
            new.row_costs = CostTable(self.row_costs.decay)
            new.row_costs.means.update({rows: seconds for rows, seconds in self.row_costs.means.items()
                                        if rows not in self.guessed_rows})
            new.guessed_rows = set(new.row_costs.means) - {1}
        return new

    def depth(self) -> int:
        """Draft depth for the next step (0 = a plain step)."""
        cfg = self.config
        if not cfg.adaptive:
            return cfg.max_depth
        if self.t_plain is None:  # measure one plain step first
            return 0
        if self.fit[0] == 0.0:  # then one short speculative step: cheap if drafts turn out wrong
            return min(cfg.probe_tokens, cfg.max_depth)
        best = max(range(cfg.max_depth + 1), key=self.expected_rate)
        if best == 0 and self.steps_since_spec >= self.probe_interval:
            return min(cfg.probe_tokens, cfg.max_depth)
        return best

    def scored_nodes(self, probs: list[float]) -> int:
        """How many nodes of a scored tree to verify (0 = a plain step). probs: the calibrated
        probability of each node, most likely first, each node after its parent."""
        if not self.config.adaptive:
            return len(probs)
        if self.t_plain is None:  # measure one plain step first
            return 0
        if self.row_costs is None:  # then the whole draft: what a verified node costs is unknown yet
            return len(probs)
        best, best_rate, total = 0, 1.0 / self.t_plain, 1.0
        for r, p in enumerate(probs, 1):
            total += p
            rate = total / self.row_costs.estimate(r + 1)
            if rate > best_rate:
                best, best_rate = r, rate
        self.probe_gain = None
        if best == 0 and probs and self.steps_since_spec >= self.probe_interval:
            best = min(self.config.probe_tokens, len(probs))
            self.probe_gain = 1.0 + sum(probs[:best])
        return best

    def record(self, depth: int, num_accepted: int, step_s: float | None,
               scores: tuple[float, ...] | None = None, parent_ids: tuple[int, ...] | None = None) -> None:
        """One step's outcome: depth drafted (0 = plain step), accepted count, draft + verify seconds
        (None: the step ran slower than its size costs, so its time is not learnt); scores: the verified
        nodes' own scores where the drafter gave them (the fit then counts nodes), parent_ids: their
        tree (None: a chain)."""
        d = self.config.decay
        if depth == 0:
            if step_s is not None:
                self.t_plain = step_s if self.t_plain is None else d * self.t_plain + (1 - d) * step_s
                if self.row_costs is not None:
                    self.row_costs.means[1] = self.t_plain
            self.steps_since_spec += 1
            return
        self.acceptance.record(depth, min(num_accepted, depth), d)
        if scores is not None:
            parents = parent_ids if parent_ids is not None else tuple(range(-1, len(scores) - 1))
            self.calibration.record(scores, parents, num_accepted, d)
        if step_s is not None:
            self._learn_cost(depth, step_s, scores)
        self.steps_since_spec = 0

    def _learn_cost(self, depth: int, step_s: float, scores: tuple[float, ...] | None) -> None:
        """A timed speculative step: its row count's cost, the line in k, and a probe's verdict."""
        d = self.config.decay
        if scores is not None:
            if self.row_costs is None:
                self.row_costs = CostTable(d)
                if self.t_plain is not None:
                    self.row_costs.means[1] = self.t_plain
            rows = len(scores) + 1
            if rows in self.guessed_rows:  # this sequence's own measurement replaces the guess
                self.guessed_rows.discard(rows)
                del self.row_costs.means[rows]
            self.row_costs.record(rows, step_s)
        if self.t_plain is not None:
            k, y = float(depth if scores is None else len(scores)), step_s - self.t_plain
            self.fit = [d * s + v for s, v in zip(self.fit, (1.0, k, k * k, y, k * y))]
        if self.steps_since_spec >= self.probe_interval:  # this was a probe
            if scores is None:
                paid = self.expected_rate(depth) > 1.0 / self.t_plain
            else:  # judged, like the batch budget's probes, on expected tokens at the measured cost
                paid = self.probe_gain is None or self.probe_gain / step_s > 1.0 / self.t_plain
            self.probe_interval = (self.config.min_probe_interval if paid
                                   else min(2 * self.probe_interval, self.config.max_probe_interval))
