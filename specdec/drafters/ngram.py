"""Prompt lookup: propose what followed the earlier occurrence of the context's end that matches it longest.

Free to run (a numpy scan of the context, no model), deterministic (q = one-hot), and strong on
prompts that get copied: code edits, JSON, quoting. As a tree it merges the continuations of
several distinct earlier matches into one trie, so the target checks them all in one forward.

How far to trust a proposal follows the match. The scan measures how many tokens the context's end
shares with each earlier occurrence (up to max_ngram) and scores every node (DraftTree.scores) by
match_score: a verbatim copy that has agreed for 40 tokens is likely to go on for 16 more, a
1-token coincidence hardly for 2. The speculation policy then drafts the whole node budget and
verifies the nodes worth their measured cost (specdec.policy.depth): a deep chain on a long match,
a few nodes (or a plain step) on a short one. With one unscored depth for every step the chains
stopped at 8 even while whole chains were accepted, and 1-token matches could not be let in.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch

from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument
from specdec.policy.budget import keep_nodes, node_order


COINCIDENCE = 0.7  # of a match's tokens, this much counts as chance, not evidence (see match_score)


@dataclass(frozen=True)
class NgramConfig:
    max_ngram: int = 32  # a match's length is counted up to this many tokens (longer = surer, drafted deeper)
    min_ngram: int = 1  # the shortest match that drafts; a 1-token match scores low, so its nodes rarely pay
    num_branches: int = 3  # 1 = a chain; more = a trie of that many distinct continuations
    num_nodes: int = 16  # the most nodes (and depth) of one draft; the policy keeps those worth their cost

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise InvalidArgument(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_branches < 1:
            raise InvalidArgument(f"num_branches must be >= 1, got {self.num_branches}")
        if not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise InvalidArgument(f"num_nodes must be an integer >= 1, got {self.num_nodes}")


def match_score(match_len: int, depth: int) -> float:
    """The chance that the `depth` tokens following a match of match_len tokens are all accepted.

    e / (e + d) with e = match_len - COINCIDENCE: a Beta(0, 1) prior on how often the copy goes on,
    updated by the e tokens of evidence it already got right (the rule of succession), a match's
    first token counting mostly as chance. It follows replays of plain greedy outputs (workload,
    Spec-Bench and bench-quick prompts, SmolLM2): after 48 matching tokens 8 more follow ~87% of the
    time (0.86 here), after 1 the next ~25% (0.23), after 6 the next 4 ~55% (0.57). The policy's
    calibration corrects the overall scale per sequence."""
    if depth == 0:
        return 1.0
    evidence = match_len - COINCIDENCE
    return evidence / (evidence + depth)


def find_matches(context: np.ndarray, config: NgramConfig) -> Iterator[tuple[int, int]]:
    """(match length, end index) of every earlier occurrence of the context's end of at least
    min_ngram tokens, longest first, then most recent: context[end - n + 1: end + 1] equals the last
    n tokens. Lengths are counted up to max_ngram; the suffix itself is not a match."""
    size = len(context)
    ends = np.flatnonzero(context[:-1] == context[-1])  # [hits] every match, each of length >= 1
    lengths = np.zeros(len(ends), dtype=np.int64)  # [hits]
    alive = np.arange(len(ends))  # hits still matching at length n
    n = 1
    while len(alive):
        lengths[alive] = n
        if n == config.max_ngram:
            break
        alive = alive[ends[alive] >= n]
        alive = alive[context[ends[alive] - n] == context[size - 1 - n]]
        n += 1
    for hit in np.lexsort((-ends, -lengths)):  # longest first, then most recent
        if lengths[hit] < config.min_ngram:
            return
        yield int(lengths[hit]), int(ends[hit])


def continuation(context: np.ndarray, end: int, length: int) -> list[int]:
    """The `length` tokens after context[end]; past the context's end it reads its own output, so a
    match one period back in a repeating pattern continues the pattern."""
    size = len(context)
    out = context[end + 1: end + 1 + length].tolist()
    while len(out) < length:  # end + 1 + i >= size: the proposal's own token end + 1 + i - size
        out.append(out[end + 1 + len(out) - size])
    return out


def merge(candidates: list[tuple[int, list[int]]], max_nodes: int) -> DraftTree:
    """One trie of the candidates' continuations ((match length, tokens), best first), scored, cut
    to its max_nodes likeliest nodes.

    A node's score is its parent's times the chance its token follows the parent's: along one
    candidate match_score's per-token ratio; where a later candidate branches off, what the earlier
    siblings leave (1 - their conditional chances) times its own. Siblings' chances so never add up
    to more than one and a node never scores above its parent (what specdec.policy expects)."""
    tokens: list[int] = []
    parents: list[int] = []
    scores: list[float] = []
    taken: dict[int, float] = {}  # node (-1: root) -> sum of its children's conditional chances
    trie: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
    for match_len, cont in candidates:
        parent = -1
        for depth, token in enumerate(cont, 1):
            node = trie.get((parent, token))
            if node is None:
                step = match_score(match_len, depth) / match_score(match_len, depth - 1)
                chance = (1.0 - taken.get(parent, 0.0)) * step
                taken[parent] = taken.get(parent, 0.0) + chance
                node = trie[(parent, token)] = len(tokens)
                tokens.append(token)
                parents.append(parent)
                scores.append((1.0 if parent < 0 else scores[parent]) * chance)
            parent = node
    tree = DraftTree(tuple(tokens), tuple(parents), scores=tuple(scores))
    if tree.num_nodes <= max_nodes:
        return tree
    return keep_nodes(tree, [node for node, _ in node_order(tree, alpha=0.0)[:max_nodes]])


class NgramSession:
    scores_nodes = True  # told to the policy before drafting (SpeculationPolicy.plan)

    def __init__(self, config: NgramConfig):
        self.config = config

    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        max_nodes = self.config.num_nodes if max_nodes is None else min(max_nodes, self.config.num_nodes)
        if max_tokens <= 0 or max_nodes <= 0 or len(context_ids) < 2:
            return DraftTree.empty()
        context = np.asarray(context_ids, dtype=np.int64)
        length = min(max_tokens, max_nodes)
        candidates: list[tuple[int, list[int]]] = []
        seen: set[tuple[int, ...]] = set()
        for match_len, end in find_matches(context, self.config):
            cont = continuation(context, end, length)
            key = tuple(cont)
            if key not in seen:
                seen.add(key)
                candidates.append((match_len, cont))
                if len(candidates) == self.config.num_branches:
                    break
        return merge(candidates, max_nodes) if candidates else DraftTree.empty()


class NgramDrafter:
    name = "ngram"

    def __init__(self, config: NgramConfig = NgramConfig()):
        self.config = config
        # The engine's depth where none is asked for: scored trees are sized by the policy against their
        # cost, so a long verbatim match may fill the whole node budget as one chain.
        self.default_depth = config.num_nodes

    def new_session(self) -> NgramSession:
        return NgramSession(self.config)
