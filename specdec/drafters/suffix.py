"""Suffix decoding (after SuffixDecoding, Oliaro et al., 2024): drafts from what was said before.

Two suffix tries (specdec.drafters.suffix_tree) are matched against the end of the context at every
step: the session's own over the current prompt and output, and the drafter's global one over the
outputs of earlier generations it drafted for, each behind the end of its prompt (one store per
engine or draft worker, bounded in tokens, oldest evicted first). Every distinct earlier occurrence
of the context's end, in either trie, is a source weighted by how far a match of its length can be
trusted, and one candidate tree takes the continuations most probable under the blend
(specdec.drafters.suffix_blend): deep along a long verbatim match (an agent resending its own
earlier output, a JSON record being reformatted), wide where short matches disagree (which key
follows `"` in a JSON answer). How much to speculate also follows the match: a match of m tokens
allows up to `spec_factor * m` nodes.

No model and no randomness (q = None: every node is a deterministic choice), so the drafts are
exact under any temperature; it costs microseconds per step on the CPU.
"""
from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass

import torch

from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.drafters.base import common_prefix_len
from specdec.drafters.suffix_blend import GLOBAL, OWN, blended_tree, sources, weights
from specdec.drafters.suffix_tree import SuffixTrie
from specdec.errors import InvalidArgument

REBUILD_AFTER = 64  # a rollback longer than this rebuilds the session's trie instead of popping token by token
# A session drafts for one sequence, whose committed prefix never changes: only its last few tokens
# can differ from what the session saw (a rejected pipelined guess). So a new context is compared
# with the session's over this many trailing tokens, not over its whole length (O(1) per step).
CHECK_WINDOW = 64


@dataclass(frozen=True)
class SuffixConfig:
    max_depth: int = 24  # longest substring the tries hold: match plus continuation
    # A match of m tokens (the longest) allows up to spec_factor * m draft nodes. The paper uses 1 for
    # one path; here the tree's width comes from blending shorter matches, whose weights already
    # follow the match length, so the cap only stops a one-token coincidence from filling the budget.
    spec_factor: float = 8.0
    min_token_prob: float = 0.05  # skip candidates whose estimated probability (along their path) is lower
    num_nodes: int = 16  # the most nodes of one draft tree (the step's max_nodes may lower it)
    # How much less sure a source is of each token of its continuation after the first, fading as the
    # match grows (specdec.drafters.suffix_blend.carry); 0 = every token as sure as the first.
    carry_miss: float = 0.2
    global_tokens: int = 65536  # token budget of the global store of earlier outputs (0 = none)

    def __post_init__(self) -> None:
        if not isinstance(self.max_depth, int) or self.max_depth < 2:
            raise InvalidArgument(f"max_depth must be an integer >= 2, got {self.max_depth}")
        if not self.spec_factor > 0:
            raise InvalidArgument(f"spec_factor must be > 0, got {self.spec_factor}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise InvalidArgument(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if not 0.0 <= self.carry_miss < 1.0:
            raise InvalidArgument(f"carry_miss must be in [0, 1), got {self.carry_miss}")
        if not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise InvalidArgument(f"num_nodes must be an integer >= 1, got {self.num_nodes}")
        if not isinstance(self.global_tokens, int) or self.global_tokens < 0:
            raise InvalidArgument(f"global_tokens must be an integer >= 0, got {self.global_tokens}")


class SuffixStore:
    """Earlier outputs of one drafter (one per engine or draft worker), bounded in tokens.

    Adding past `max_tokens` evicts whole sequences, oldest first; a sequence longer than the budget
    keeps its end. Thread-safe: sessions read it (under `lock`) while a finishing one adds to it."""

    def __init__(self, max_depth: int, max_tokens: int):
        self.trie = SuffixTrie(max_depth)
        self.max_tokens = max_tokens
        self.lengths: deque[int] = deque()  # of the stored sequences, oldest first
        self.num_tokens = 0
        self.lock = threading.Lock()

    @property
    def num_sequences(self) -> int:
        return len(self.lengths)

    def add(self, token_ids) -> None:
        token_ids = list(token_ids)[-self.max_tokens:]
        if not token_ids:
            return
        with self.lock:
            while self.lengths and self.num_tokens + len(token_ids) > self.max_tokens:
                oldest = self.lengths.popleft()
                self.trie.remove_first(oldest)
                self.num_tokens -= oldest
            for token in token_ids:
                self.trie.append(token)
            self.trie.end_sequence()
            self.lengths.append(len(token_ids))
            self.num_tokens += len(token_ids)

    def clear(self) -> None:
        with self.lock:
            self.trie = SuffixTrie(self.trie.max_depth)
            self.lengths.clear()
            self.num_tokens = 0


class SuffixSession:
    """One sequence: its own trie over the committed context (kept in step with every propose by
    appending, or popping after a rollback), and the drafter's shared store.

    Its trees carry each node's blended probability as its score (DraftTree.scores), so the
    speculation policy lets it draft the whole depth and verifies the nodes worth their cost: a
    long verbatim match goes deep even where the sequence's acceptance so far is low."""

    scores_nodes = True  # told to the policy before drafting (SpeculationPolicy.plan)

    def __init__(self, config: SuffixConfig, store: SuffixStore | None):
        self.config = config
        self.store = store
        self.trie = SuffixTrie(config.max_depth)  # its text is the context this session last saw
        self.closed = False

    def _sync(self, context_ids: list[int]) -> None:
        mine = self.trie.tokens
        n = min(len(mine), len(context_ids))
        start = max(0, n - CHECK_WINDOW)
        if len(mine) > n or context_ids[start:n] != mine[start:n]:  # a rollback: drop what is not shared
            keep = start + common_prefix_len(mine[start:n], context_ids[start:n])
            if len(mine) - keep > REBUILD_AFTER:
                self.trie = SuffixTrie(self.config.max_depth)
            else:
                for _ in range(len(mine) - keep):
                    self.trie.pop()
        for token in context_ids[len(self.trie.tokens):]:
            self.trie.append(token)

    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        if self.closed:  # released while a draft worker's thread was still drafting for it
            return DraftTree.empty()
        self._sync(context_ids)
        budget = self.config.num_nodes if max_nodes is None else min(max_nodes, self.config.num_nodes)
        if max_tokens <= 0 or budget <= 0:
            return DraftTree.empty()
        found = sources(self.trie, OWN, context_ids, max_tokens)
        if self.store is None:
            return self._tree(found, max_tokens, budget)
        with self.store.lock:  # the store's states are read while the tree grows
            return self._tree(found + sources(self.store.trie, GLOBAL, context_ids, max_tokens), max_tokens, budget)

    def _tree(self, found: list, max_tokens: int, budget: int) -> DraftTree:
        if not found:
            return DraftTree.empty()
        longest = max(s.match_len for s in found)
        num_nodes = min(budget, max(1, int(self.config.spec_factor * longest)))
        tokens, parents, probs = blended_tree(weights(found), max_tokens, num_nodes, self.config.min_token_prob,
                                             self.config.carry_miss)
        return DraftTree(tuple(tokens), tuple(parents), scores=tuple(probs))

    def close(self, context_ids: list[int], num_prompt_tokens: int) -> None:
        """The generation ended with context_ids (prompt + output): its output joins the drafter's
        global store, so later generations can draft from it. Later calls do nothing.

        The output goes in behind the prompt's last max_depth tokens: a later prompt that ends the
        same way (the same instruction, or just the chat template's assistant header) then leads
        into the answers that followed it, while long prompts do not eat the store's budget."""
        if self.closed:
            return
        self.closed = True  # the trie stays: a draft worker's thread may still be inside propose()
        if self.store is not None and len(context_ids) > num_prompt_tokens:
            self.store.add(context_ids[max(0, num_prompt_tokens - self.config.max_depth):])


class SuffixDrafter:
    name = "suffix"

    def __init__(self, config: SuffixConfig = SuffixConfig()):
        self.config = config
        # The engine's depth where none is asked for: its trees are sized by their nodes' scores against
        # their cost (specdec.policy.depth), so the depth need not bound them below the node budget: a
        # sure verbatim copy may fill the whole budget as one chain.
        self.default_depth = config.num_nodes
        self.store = SuffixStore(config.max_depth, config.global_tokens) if config.global_tokens else None

    def new_session(self) -> SuffixSession:
        return SuffixSession(self.config, self.store)

    def reset(self) -> None:
        """Forget every earlier generation (benchmarks start each run from the same empty state)."""
        if self.store is not None:
            self.store.clear()
