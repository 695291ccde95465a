"""The speculation policy: how deep to draft and how many nodes to verify, for every path.

The in-process engine, in-process batching, the target worker (its own drafting and the drafts it
receives) and the draft worker all ask one `SpeculationPolicy`, so a rule lands once:

    budget = policy.plan(key, limit)                  # before drafting: DraftBudget(depth, max_nodes)
    tree   = session.propose(ctx, budget.depth, ..., max_nodes=budget.max_nodes)
    trees  = policy.allocate(keys, trees, sampled)    # what one forward verifies
    ...verify step...
    policy.record(keys, trees, steps, verify_s, draft_s)

Two estimates live here, once each: per sequence, the acceptance alpha and the sequence's own best
depth (specdec.policy.depth); per worker, the batch node budget R from measured forward costs
(specdec.policy.budget). A limiting batch budget decides the depth (it sees the batch and its costs);
without one the sequence's own choice does.

Exactness (the shape rule). Verification yields the target's distribution only if, whenever a draft
node is judged, its token is distributed as the q it carries given everything that decided the node
is there. So a node's presence may depend on what was fixed before its own token was drawn (its
ancestors, earlier draws, the budget, the policy's past statistics), never on its own token or later
draws. Hence:
- deterministic trees (q is None: prompt lookup, Medusa, EAGLE's top-k tree) and every tree of a
  greedy sequence are functions of the committed context alone: they may be cut freely, here by
  likelihood order;
- a sampled tree (q given, temperature > 0) is never cut by anything that looks at its shape. It is
  cut only to its first `planned` nodes, `planned` being the node budget fixed before it was drafted.
  Drafters list nodes in draw order and decide a node's presence from earlier draws only (see
  specdec.drafters.base), so a prefix keeps every kept node's q exact. A pipelined draft drafted
  before its budget was announced is cut the same way.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from specdec.core.tree import DraftTree
from specdec.policy.budget import NO_CAP, BatchBudget, BudgetConfig, CostTable, keep_nodes, node_order
from specdec.policy.depth import Acceptance, DepthConfig, DepthController

__all__ = ["NO_CAP", "CostTable", "DraftBudget", "PolicyConfig", "SpeculationPolicy", "keep_nodes", "node_order"]


@dataclass(frozen=True)
class PolicyConfig:
    max_depth: int = 8  # the most draft tokens along any path
    adaptive: bool = True  # per-sequence depth from acceptance and cost; False = always max_depth
    load_aware: bool = True  # per-batch node budget from measured forward costs
    depth: DepthConfig | None = None  # finer knobs (None: defaults with max_depth / adaptive above)
    budget: BudgetConfig | None = None


@dataclass(frozen=True)
class DraftBudget:
    depth: int  # deepest node the drafter may propose (0 = do not draft)
    max_nodes: int | None  # most nodes the step will verify (None = the drafter's own limit)


class SpeculationPolicy:
    def __init__(self, config: PolicyConfig = PolicyConfig(), ragged: bool = False):
        """ragged: the forwards it sizes compute each sequence's own rows (ModelRunner.ragged), so a batch
        costs the sum of its trees' rows and takes the most likely nodes of all of them (choose_each);
        else the batch is padded to its largest tree and every tree gets one node count R (choose)."""
        self.config = config
        self.ragged = ragged
        self.depth_config = config.depth or DepthConfig(max_depth=config.max_depth, adaptive=config.adaptive)
        self.batch = BatchBudget(config.budget or BudgetConfig(enabled=config.load_aware))
        self.seqs: dict[str, DepthController] = {}
        self.planned: dict[str, int] = {}  # key -> node budget fixed before its pending draft was drafted
        self.idle: dict[str, int] = {}  # key -> steps since a draft node of it was verified (ragged exploring)
        self.pool = Acceptance()  # worker-wide acceptance: the prior of new sequences
        self.learned: DepthController | None = None  # the last finished sequence's: new ones start from its costs

    def add(self, key: str) -> None:
        if self.learned is not None:
            self.seqs[key] = self.learned.carry_over(self.depth_config, self.pool.prior())
        else:
            self.seqs[key] = DepthController(self.depth_config, self.pool.prior())

    def remove(self, key: str) -> None:
        seq = self.seqs.pop(key, None)
        self.planned.pop(key, None)
        self.idle.pop(key, None)
        if seq is not None and seq.t_plain is not None:
            self.learned = seq

    def continue_from(self, earlier: SpeculationPolicy) -> SpeculationPolicy:
        """Start from the step costs (and the drafter's calibration) an earlier policy of the same
        engine learnt: the engine makes one policy per generation (or per in-process batch run), and the
        machine does not change between them: the sequences' costs and the batch budget's verify
        costs. Acceptance is not carried: a new prompt's starts neutral, as before. Returns self."""
        self.learned = earlier.learned
        self.batch.continue_from(earlier.batch)
        return self

    def alpha(self, key: str) -> float:
        seq = self.seqs.get(key)
        return min(seq.alpha if seq is not None else self.pool.alpha, 0.999)

    def cap(self) -> int:
        """The batch's node budget for the next step (0 = do not draft, NO_CAP = no limit)."""
        return self.batch.cap()

    def announce(self, key: str) -> int:
        """The node budget of this sequence's next step (0 = do not draft, NO_CAP = no limit), fixed
        now, before anyone drafts for it: a draft worker is told it, and its draft is cut to it."""
        nodes = self.cap()
        if key in self.seqs:
            self.planned[key] = nodes
        return nodes

    def scale(self, key: str) -> Callable[[int], float]:
        """How far this sequence's drafter's own node scores proved right, as the factor for a node's
        score at each depth (1.0 = as scored)."""
        seq = self.seqs.get(key)
        return seq.calibration.scale_at if seq is not None else (lambda depth: 1.0)

    def plan(self, key: str, limit: int, cap: int | None = None, scored: bool = False) -> DraftBudget:
        """How to draft this sequence's next step; limit: the deepest the sequence allows (tokens
        left, context room); cap: a node budget announced by the target (draft worker side);
        scored: the drafter scores its own nodes, so it drafts the whole depth and the nodes worth
        verifying are chosen after drafting (allocate)."""
        nodes = self.announce(key)
        if nodes == 0 and self._explore_due(key):  # ragged: a node for a sequence unverified for long
            nodes = 1
            if key in self.seqs:
                self.planned[key] = nodes
        if cap is not None and cap < nodes:
            nodes = cap
            if key in self.seqs:
                self.planned[key] = nodes
        seq = self.seqs.get(key)
        if seq is None or (scored and seq.t_plain is not None):
            own = self.depth_config.max_depth
        else:
            own = seq.depth()
        depth = own if nodes >= NO_CAP else nodes
        depth = max(0, min(depth, self.depth_config.max_depth, limit))
        return DraftBudget(depth, None if nodes >= NO_CAP else nodes)

    def allocate(self, keys: list[str], trees: list[DraftTree], sampled: list[bool], agree=None) -> list[DraftTree]:
        """The trees one forward verifies. sampled[i]: trees[i] was drawn at random (q given and the
        sequence samples): cut only to its planned prefix. Others: cut to the batch's best R, or where
        forwards are ragged and no tree in the batch is sampled to the batch's most likely nodes (a
        sampled tree's prefix is planned as R before it is drafted, so a batch holding one keeps one R).
        agree(count): where every tensor-parallel rank cuts its own copy (the engine under --tp), rank
        0's node count for all: counts follow each rank's timings, the order they cut in does not."""
        agree = agree or (lambda count: count)
        out = [_prefix(t, self.planned.get(k, NO_CAP)) if s else t for k, t, s in zip(keys, trees, sampled)]
        # No batch budget, or a batch of one with adaptive depths (no other sequence's rows to trade against,
        # and the sequence's own controller weighs its costs): trees are sized by their own sequence, as in
        # process. The budget alone at one user drafted too little (a served hybrid drafter: tau 1.1-1.4
        # against 1.74, 106-133 against 145 tok/s).
        self.batch.alone = len(out) == 1 and self.depth_config.adaptive
        if not self.batch.config.enabled or self.batch.alone:
            return [t if s else self._own_cut(k, t, agree) for k, t, s in zip(keys, out, sampled)]
        orders = [node_order(t, self.alpha(k), self.scale(k)) for k, t in zip(keys, out)]
        likely = [[p for _, p in order] for order in orders]
        # one R where a sampled tree is verified to its planned prefix (one R plans it), or for one sequence
        if self.ragged and len(out) > 1 and not any(sampled):
            explore = [self._explore_due(k) for k in keys]
            counts = [agree(c) for c in self.batch.choose_each(likely, len(out), explore)]
        else:
            counts = [agree(self.batch.choose(likely, len(out)))] * len(out)
        return [t if s else keep_nodes(t, [i for i, _ in order[:count]])
                for t, s, order, count in zip(out, sampled, orders, counts)]

    def record(self, keys: list[str], trees: list[DraftTree], steps: list, verify_s: float,
               draft_s: float = 0.0, wait_s: float = 0.0, timed: bool = True) -> None:
        """One forward's outcome: trees as verified, each sequence's StepResult (None: it failed).
        draft_s: drafting on this thread before it; wait_s: the step's wait for drafts made elsewhere.
        timed False: the forward was run slower than its size costs (a thread-team probe): what was
        accepted is learnt, its seconds are not. A ragged forward's rows are counted by their sum, a padded
        one's as the batch times its largest tree."""
        if self.ragged:
            rows = sum(1 + t.num_nodes for t in trees)
        else:
            rows = len(trees) * (1 + max((t.num_nodes for t in trees), default=0))
        # A verified draft's step costs what was spent getting it too: with the forward nearly flat in its
        # rows, that time (drafts over gRPC, drafting between forwards) is what decides whether drafting pays.
        step_s = verify_s + (draft_s + wait_s if rows > len(trees) else 0.0)
        self.batch.record(rows, step_s if timed else None, sum(len(s.token_ids) for s in steps if s is not None),
                          len(trees))
        for key, tree, step in zip(keys, trees, steps):
            self.idle[key] = 0 if tree.num_nodes else self.idle.get(key, 0) + 1
            if self.ragged and len(trees) > 1 and not tree.num_nodes and key in self.seqs:
                self.seqs[key].acceptance.regain(self.pool.prior(), self.batch.config.regain_keep)
            if step is not None:
                self.observe(key, step.depth if tree.num_nodes else 0, step.num_accepted,
                             verify_s + draft_s if timed else None, tree.scores if tree.num_nodes else None,
                             tree.parent_ids)

    def observe(self, key: str, depth: int, num_accepted: int, step_s: float | None,
                scores: tuple[float, ...] | None = None, parent_ids: tuple[int, ...] | None = None) -> None:
        """One step of one sequence: depth verified (0 = plain), accepted tokens, its seconds (None: not
        what such a step costs), and the verified nodes' own scores where the drafter gave them, with
        their tree's parent_ids (None: a chain)."""
        seq = self.seqs.get(key)
        if seq is None:
            return
        seq.record(depth, num_accepted, step_s, scores, parent_ids)
        if depth > 0:
            self.pool.record(depth, min(num_accepted, depth), self.depth_config.decay)


    def _explore_due(self, key: str) -> bool:
        """Whether a ragged batch owes this sequence a verified node: none for BudgetConfig.explore_interval
        steps, or for the probe interval when probes have found drafting unprofitable (at a batch of 32 with
        nothing accepted, a node per sequence every 32 steps cost 3% of plain speed)."""
        interval = max(self.batch.config.explore_interval, self.batch.probe_interval)
        return self.batch.chose_each and self.idle.get(key, 0) >= interval

    def _own_cut(self, key: str, tree: DraftTree, agree) -> DraftTree:
        """A scored tree cut to the nodes its sequence's controller finds worth verifying."""
        seq = self.seqs.get(key)
        if seq is None or tree.scores is None or not tree.num_nodes:
            return tree
        order = node_order(tree, seq.alpha, seq.calibration.scale_at)
        return keep_nodes(tree, [i for i, _ in order[:agree(seq.scored_nodes([p for _, p in order]))]])


def _prefix(tree: DraftTree, num_nodes: int) -> DraftTree:
    """The first num_nodes nodes in draw order (parents come first, so it is a valid tree)."""
    return tree if tree.num_nodes <= num_nodes else keep_nodes(tree, list(range(num_nodes)))


def is_sampled(tree: DraftTree, greedy: bool) -> bool:
    """Whether the tree's shape may depend on random draws (it must not be cut by its shape)."""
    return tree.q is not None and not greedy
