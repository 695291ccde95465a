"""Suffix decoding and Medusa heads in one drafter (as Arctic Inference pairs suffix decoding with a
model-based speculator).

The two win in different places: suffix decoding where the answer copies the prompt or earlier
output (its trees are long and sure there, and it costs microseconds), Medusa elsewhere (its heads
guess the next few tokens of any text, but shallowly). Both are deterministic (q = None), so every
step may use either tree, or both, and stay exact at any temperature. Two ways to combine them:

- "union": both trees merged into one (a path both propose is one path, scored by the more
  confident of the two). Every node carries a score (suffix: its blended probability; Medusa: the
  product of its heads' probabilities), so the speculation policy keeps the nodes worth their
  verify cost from either source, scaled by its own calibration against what was accepted.
- "choose": the suffix tree alone when its expected accepted tokens (the sum of its scores) reach
  `threshold`, else Medusa's tree alone: one source per step, never a wider tree than either.

Exactness. A node's presence must not depend on its own token's draw (specdec.policy). Both trees
here are deterministic, so merging and cutting them is free. Should a sub-drafter ever return q rows
(a sampled tree), the step falls back to a deterministic tree of the other drafter (or, if both were
sampled, the suffix one unchanged): merging a sampled tree with another would change which nodes
sit where on the strength of its draws.
"""
from __future__ import annotations

from dataclasses import dataclass, fields

import torch

from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument
from specdec.policy.budget import keep_nodes, node_order

MODES = ("union", "choose")


@dataclass(frozen=True)
class HybridConfig:
    mode: str = "union"
    # "choose": the suffix tree's expected accepted tokens (sum of its node scores) from which it drafts alone
    threshold: float = 1.0
    # Medusa's static tree: its first N ranked paths (0 = all the checkpoint lists). 8 by default: with all
    # 48 of the shipped heads' list, served one-user load tests (bf16) ran no faster (paired 1.49 / 1.52 /
    # 1.50 against 1.55 / 1.49 / 1.55 with 8, tau 1.96 against 1.93), while standalone Medusa keeps all 48.
    medusa_nodes: int = 8

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise InvalidArgument(f"hybrid mode must be one of {', '.join(MODES)}, got {self.mode!r}")
        if not self.threshold >= 0.0:
            raise InvalidArgument(f"hybrid threshold must be >= 0, got {self.threshold}")
        if not isinstance(self.medusa_nodes, int) or self.medusa_nodes < 0:
            raise InvalidArgument(f"medusa_nodes must be an integer >= 0, got {self.medusa_nodes}")


HYBRID_OPTIONS = frozenset(f.name for f in fields(HybridConfig))


def merge_trees(first: DraftTree, second: DraftTree, max_nodes: int | None = None) -> DraftTree:
    """The union of two scored deterministic trees: second's paths added to first's, a path both
    hold kept once with the larger score. Node order: first's nodes, then second's new ones, each
    after its parent. Over max_nodes, the most probable max_nodes (by score; a closed sub-tree).

    Max keeps every node's score at most its parent's (true in each tree, so true of the maxima),
    which the policy's node order relies on."""
    if first.q is not None or second.q is not None:
        raise InvalidArgument("only deterministic trees (q = None) can be merged")
    tokens, parents = list(first.token_ids), list(first.parent_ids)
    scores = list(_scores(first))
    where = {(p, t): i for i, (t, p) in enumerate(zip(tokens, parents))}  # (merged parent, token) -> merged node
    second_scores = _scores(second)
    remap: list[int] = []  # second's node -> merged node
    for token, parent, score in zip(second.token_ids, second.parent_ids, second_scores):
        key = (-1 if parent < 0 else remap[parent], token)
        node = where.get(key)
        if node is None:
            node = len(tokens)
            tokens.append(token)
            parents.append(key[0])
            scores.append(score)
            where[key] = node
        else:
            scores[node] = max(scores[node], score)
        remap.append(node)
    merged = DraftTree(tuple(tokens), tuple(parents), None, tuple(scores))
    if max_nodes is not None and merged.num_nodes > max_nodes:
        order = node_order(merged, alpha=0.5)  # scored: alpha is not used
        merged = keep_nodes(merged, [i for i, _ in order[:max_nodes]])
    return merged


def _scores(tree: DraftTree) -> tuple[float, ...]:
    if tree.scores is None:
        raise InvalidArgument("only scored trees can be merged (DraftTree.scores)")
    return tree.scores


def choose_tree(suffix: DraftTree, medusa: DraftTree, threshold: float) -> DraftTree:
    """The suffix tree where it expects at least `threshold` accepted tokens, else Medusa's (the
    suffix tree again when Medusa has nothing)."""
    expected = sum(suffix.scores) if suffix.scores is not None else 0.0
    if suffix.num_nodes and expected >= threshold or not medusa.num_nodes:
        return suffix
    return medusa


class HybridSession:
    """One sequence: a suffix session (its trie, the shared store) and a Medusa session (the heads
    read the target's hidden state, handed over by `attach`)."""

    scores_nodes = True  # every tree is scored: the policy sizes it by its scores (SpeculationPolicy.plan)

    def __init__(self, drafter: HybridDrafter):
        self.config = drafter.config
        self.batch_owner = drafter  # a batch's Medusa heads run together (HybridDrafter.prepare)
        self.suffix = drafter.suffix.new_session()
        self.medusa = drafter.medusa.new_session()

    def attach(self, sequence) -> None:
        self.medusa.attach(sequence)

    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        suffix = self.suffix.propose(context_ids, max_tokens, params, generator, max_nodes)
        if suffix.q is not None:  # sampled: only exact alone (see the module docstring)
            return suffix
        medusa = self.medusa.propose(context_ids, max_tokens, params, generator, max_nodes)
        if medusa.q is not None:
            return suffix
        if self.config.mode == "choose":
            return choose_tree(suffix, medusa, self.config.threshold)
        if not suffix.num_nodes:
            return medusa
        return merge_trees(suffix, medusa, max_nodes)

    def close(self, context_ids: list[int], num_prompt_tokens: int) -> None:
        """The generation ended: its output joins the suffix drafter's global store."""
        self.suffix.close(context_ids, num_prompt_tokens)


class HybridDrafter:
    name = "hybrid"

    def __init__(self, suffix, medusa, config: HybridConfig = HybridConfig()):
        """suffix: a SuffixDrafter; medusa: a MedusaDrafter (over the served target's LM head)."""
        self.suffix = suffix
        self.medusa = medusa
        self.config = config
        self.default_depth = suffix.default_depth  # scored trees: the policy cuts them by cost

    def new_session(self) -> HybridSession:
        return HybridSession(self)

    def prepare(self, sessions: list[tuple[HybridSession, int, int | None]]) -> None:
        """(session, depth, max_nodes) of one step's sequences: their Medusa heads in one product."""
        prepare = getattr(self.medusa, "prepare", None)
        if prepare is not None:
            prepare([(s.medusa, depth, nodes) for s, depth, nodes in sessions])

    def reset(self) -> None:
        """Forget every earlier generation (the suffix drafter's global store)."""
        self.suffix.reset()


def build_hybrid(target, draft_path, options: dict, runner_config=None) -> HybridDrafter:
    """The hybrid drafter over `target`: Medusa heads from draft_path (or the shipped checkpoint),
    suffix decoding with the remaining options. runner_config: build_self_drafter's."""
    from specdec.drafters.suffix import SuffixConfig, SuffixDrafter
    from specdec.drafters.trained import build_self_drafter

    config = HybridConfig(**{k: v for k, v in options.items() if k in HYBRID_OPTIONS})
    suffix = SuffixDrafter(SuffixConfig(**{k: v for k, v in options.items() if k not in HYBRID_OPTIONS}))
    medusa = build_self_drafter("medusa", target, draft_path, {"num_nodes": config.medusa_nodes},
                                runner_config)
    return HybridDrafter(suffix, medusa, config)
