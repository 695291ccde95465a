"""Load-aware speculation: how many draft nodes each sequence of a batch gets verified this step.

Speculation pays when a forward is bound by reading the weights: one extra row is almost free. At
high load the forward is already bound by compute, every extra row costs, and drafting makes the
system slower than plain batched decoding. So the step that verifies a batch decides, from measured
costs and measured acceptance, how deep to verify, and trims the trees to that:

    rows per sequence   R + 1             the batch is padded to its longest tree (specdec.batch), so
                                          every sequence gets the same node budget R (0 = plain step)
    cost                t(B * (R + 1))    seconds of one verify forward over B sequences, measured:
                                          decayed mean per padded row count, interpolated between
                                          measured counts, extrapolated pessimistically above them
    gain                B + sum_i sum_{node kept} P_i(node)
    P_i(node)           P_i(parent) * alpha_i * (1 - alpha_i)^rank   (rank among its siblings): the
                                          chance verification reaches and accepts the node; a chain
                                          gives alpha^depth. alpha_i = decayed accepted / (accepted +
                                          rejections) of sequence i, starting from the worker's mean
    choice              R maximising gain / cost

Every sequence keeps its R most likely nodes; a node is kept only with its parent and its earlier
siblings, so the trimmed tree is a valid draft whose nodes keep the q they were drawn from (a
later sibling's q assumes the earlier ones were drawn first). The choice depends on tree shapes and
past statistics only, never on the draft tokens, so trimming never changes the output distribution.

Costs above the measured row counts are unknown (extrapolated from the two largest), so every
`probe_interval` steps one step verifies `probe_tokens` more per sequence (one in batches of 4 or
more, where each probed node costs a row per sequence) than the choice and
measures it; a probe that did not beat the choice's expected rate doubles the interval (to at most
max_probe_interval), so under load, where speculation never pays, probing costs well under a percent. `hint(key)` tells drafters how much to draft for the next step (0 = the step will not
verify drafts, so don't draft and the target need not wait for one).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

from specdec.core.tree import DraftTree

NO_CAP = 1 << 16


@dataclass(frozen=True)
class LoadAwareConfig:
    enabled: bool = True
    decay: float = 0.9  # weight of history in acceptance counts and cost means
    probe_tokens: int = 2
    min_probe_interval: int = 8
    max_probe_interval: int = 256


def draft_depth(budget: int | None, controller_choice: int, max_tokens: int) -> int:
    """Depth to draft: a limiting batch budget decides (it sees the batch and its costs); without one
    (None or NO_CAP) the sequence's own controller does. At most max_tokens either way."""
    choice = controller_choice if budget is None or budget >= NO_CAP else budget
    return min(choice, max_tokens)


class CostTable:
    """Seconds per verify forward against its padded row count: decayed means per measured count."""

    def __init__(self, decay: float):
        self.decay = decay
        self.means: dict[int, float] = {}

    def record(self, num_rows: int, seconds: float) -> None:
        old = self.means.get(num_rows)
        self.means[num_rows] = seconds if old is None else self.decay * old + (1 - self.decay) * seconds

    def estimate(self, num_rows: int) -> float | None:
        if num_rows in self.means:
            return self.means[num_rows]
        known = sorted(self.means)
        if not known:
            return None
        at = bisect.bisect(known, num_rows)
        if at == 0:  # below every measured count: proportional to the smallest
            return self.means[known[0]] * num_rows / known[0]
        lo = known[at - 1]
        if at == len(known):  # above: extend the line through the two largest, never below proportional/2
            slope = self.means[lo] / lo / 2
            if len(known) >= 2:
                slope = max(slope, (self.means[lo] - self.means[known[-2]]) / (lo - known[-2]))
            return self.means[lo] + slope * (num_rows - lo)
        hi = known[at]
        w = (num_rows - lo) / (hi - lo)
        return (1 - w) * self.means[lo] + w * self.means[hi]


@dataclass
class _SeqStats:
    accepted: float
    rejections: float

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)


class LoadAwareBudget:
    def __init__(self, config: LoadAwareConfig = LoadAwareConfig()):
        self.config = config
        self.costs = CostTable(config.decay)
        self.seqs: dict[str, _SeqStats] = {}
        self.accepted, self.rejections = 1.0, 1.0  # worker-wide, the prior of new sequences
        self.last_budget = NO_CAP  # R chosen at the last step (NO_CAP: drafts were not trimmed)
        self.steps_since_probe = 0
        self.probe_interval = config.min_probe_interval
        self.probe_expected: float | None = None  # during a probe step: the expected rate of the choice

    def add(self, key: str) -> None:
        total = self.accepted + self.rejections
        self.seqs[key] = _SeqStats(2.0 * self.accepted / total, 2.0 * self.rejections / total)

    def remove(self, key: str) -> None:
        self.seqs.pop(key, None)

    def hint(self, key: str) -> int:
        """Most draft nodes the next step will verify for this sequence (0 = do not draft)."""
        if not self.config.enabled:
            return NO_CAP
        if self.last_budget != NO_CAP and self.steps_since_probe + 1 >= self.probe_interval:
            return self.last_budget + self.config.probe_tokens  # drafts for a probe (trimmed by allocate)
        return self.last_budget if self.last_budget == 0 else NO_CAP if self.last_budget == NO_CAP \
            else self.last_budget + 1

    def allocate(self, keys: list[str], trees: list[DraftTree]) -> list[DraftTree]:
        """The trees to verify in one forward: each trimmed to the chosen per-sequence node budget."""
        max_nodes = max((t.num_nodes for t in trees), default=0)
        self.probe_expected = None
        if not self.config.enabled or max_nodes == 0:
            return trees
        batch = len(trees)
        orders = [self._node_order(t, self._alpha(k)) for k, t in zip(keys, trees)]
        best_r, best_rate = 0, None
        for r in range(max_nodes + 1):
            cost = self.costs.estimate(batch * (r + 1))
            if cost is None or cost <= 0:
                continue
            rate = (batch + sum(sum(p for _, p in order[:r]) for order in orders)) / cost
            if best_rate is None or rate > best_rate:
                best_r, best_rate = r, rate
        probe = self._probe_tokens(batch)
        if not self.costs.means:  # nothing measured yet: a short first draft measures a speculative step
            best_r = min(probe, max_nodes)
        elif self.steps_since_probe + 1 >= self.probe_interval and best_r < max_nodes:
            self.probe_expected = best_rate or 0.0
            best_r = min(best_r + probe, max_nodes)
        self.last_budget = NO_CAP if best_r >= max_nodes else best_r
        return [_keep(t, [i for i, _ in order[:best_r]]) for t, order in zip(trees, orders)]

    def record(self, keys: list[str], trees: list[DraftTree], steps: list, seconds: float) -> None:
        """The forward's outcome: trees as verified, each sequence's StepResult (or None), wall seconds."""
        d = self.config.decay
        rows = len(trees) * (1 + max((t.num_nodes for t in trees), default=0))
        self.costs.record(rows, seconds)
        num_tokens = 0
        for key, tree, step in zip(keys, trees, steps):
            if step is None:
                continue
            num_tokens += len(step.token_ids)
            stats = self.seqs.get(key)
            if tree.num_nodes == 0 or stats is None:
                continue
            accepted = min(step.num_accepted, step.depth)
            rejected = 1.0 if accepted < step.depth else 0.0
            stats.accepted, stats.rejections = d * stats.accepted + accepted, d * stats.rejections + rejected
            self.accepted, self.rejections = d * self.accepted + accepted, d * self.rejections + rejected
        self.steps_since_probe += 1
        if self.probe_expected is not None:  # did the probe beat what the choice was expected to do?
            paid = num_tokens / seconds >= 1.02 * self.probe_expected  # a clear gain, not timing noise
            # a probe of a big batch costs more (every sequence's drafts, resynchronised drafters): rarer
            floor = self.config.min_probe_interval * (4 if len(trees) >= 4 else 1)
            self.probe_interval = floor if paid else min(max(2 * self.probe_interval, floor),
                                                         self.config.max_probe_interval)
            self.steps_since_probe = 0

    def _probe_tokens(self, batch: int) -> int:
        """Probe depth: a probe costs batch * depth extra rows, so big batches probe one node deep."""
        return self.config.probe_tokens if batch < 4 else 1

    def _alpha(self, key: str) -> float:
        stats = self.seqs.get(key)
        alpha = stats.alpha if stats is not None else self.accepted / (self.accepted + self.rejections)
        return min(alpha, 0.999)

    @staticmethod
    def _node_order(tree: DraftTree, alpha: float) -> list[tuple[int, float]]:
        """(node, P(node)) most likely first; a node comes after its parent and its earlier siblings."""
        probs, rank, seen = [], [], {}
        for i, parent in enumerate(tree.parent_ids):
            rank.append(seen.get(parent, 0))
            seen[parent] = rank[-1] + 1
            probs.append((1.0 if parent < 0 else probs[parent]) * alpha * (1 - alpha) ** rank[-1])
        return sorted(enumerate(probs), key=lambda item: (-item[1], item[0]))


def _keep(tree: DraftTree, nodes: list[int]) -> DraftTree:
    """The sub-tree made of `nodes` (closed under parents and earlier siblings), re-indexed."""
    if len(nodes) == tree.num_nodes:
        return tree
    nodes = sorted(nodes)
    index = {node: i for i, node in enumerate(nodes)}
    parents = tuple(-1 if tree.parent_ids[n] < 0 else index[tree.parent_ids[n]] for n in nodes)
    q = tree.q[nodes] if tree.q is not None and nodes else None
    return DraftTree(tuple(tree.token_ids[n] for n in nodes), parents, q)
