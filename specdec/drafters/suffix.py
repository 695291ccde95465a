"""Suffix decoding (after SuffixDecoding, Oliaro et al., 2024): drafts from what was said before.

Two suffix tries (specdec.drafters.suffix_tree) are matched against the end of the context at every
step: the session's own over the current prompt and output, and the drafter's global one over the
outputs of earlier generations it drafted for, each behind the end of its prompt (one store per
engine or draft worker, bounded in tokens, oldest evicted first). From the longest earlier
occurrence of the context's end, each proposes a tree of the continuations that followed it, most
frequent first, and the tree with the larger expected number of accepted tokens goes to the
target. How much to speculate follows the match: a match of m tokens allows up to `spec_factor * m`
nodes, so a long verbatim match (an agent resending its own earlier output, a JSON record being
reformatted) buys a deep draft and a two-token coincidence a short one.

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
    # A match of m tokens allows up to spec_factor * m draft nodes. The paper uses 1; here 2, because a
    # CPU verify forward of 16 rows costs about what one of 2 does, so a longer draft per match is cheap.
    spec_factor: float = 2.0
    min_token_prob: float = 0.1  # skip candidates whose estimated probability (along their path) is lower
    num_nodes: int = 16  # the most nodes of one draft tree (the step's max_nodes may lower it)
    global_tokens: int = 65536  # token budget of the global store of earlier outputs (0 = none)

    def __post_init__(self) -> None:
        if not isinstance(self.max_depth, int) or self.max_depth < 2:
            raise InvalidArgument(f"max_depth must be an integer >= 2, got {self.max_depth}")
        if not self.spec_factor > 0:
            raise InvalidArgument(f"spec_factor must be > 0, got {self.spec_factor}")
        if not 0.0 <= self.min_token_prob <= 1.0:
            raise InvalidArgument(f"min_token_prob must be in [0, 1], got {self.min_token_prob}")
        if not isinstance(self.num_nodes, int) or self.num_nodes < 1:
            raise InvalidArgument(f"num_nodes must be an integer >= 1, got {self.num_nodes}")
        if not isinstance(self.global_tokens, int) or self.global_tokens < 0:
            raise InvalidArgument(f"global_tokens must be an integer >= 0, got {self.global_tokens}")


def draft_from(trie: SuffixTrie, context_ids: list[int], max_tokens: int, max_nodes: int,
               config: SuffixConfig) -> tuple[list[int], list[int], float]:
    """(token ids, parent ids, score) continuing context_ids from `trie`; empty when nothing matches.

    The trie holds depth max_depth, so matching on at most max_depth - max_tokens tokens leaves room
    for a full-depth draft; the budget still follows the whole match length."""
    tail = context_ids[-(trie.max_depth - 1):]
    match_len = trie.longest_match(tail)
    if match_len == 0:
        return [], [], 0.0
    num_nodes = min(max_nodes, max(1, int(config.spec_factor * match_len)))
    used = max(1, min(match_len, trie.max_depth - max_tokens))
    start = trie.find(tail[len(tail) - used:])
    return trie.draft(start, min(max_tokens, trie.max_depth - used), num_nodes, config.min_token_prob)


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
    appending, or popping after a rollback), and the drafter's shared store."""

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
        best = draft_from(self.trie, context_ids, max_tokens, budget, self.config)
        if self.store is not None:
            with self.store.lock:
                shared = draft_from(self.store.trie, context_ids, max_tokens, budget, self.config)
            if shared[2] > best[2]:
                best = shared
        return DraftTree(tuple(best[0]), tuple(best[1]))

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
        self.store = SuffixStore(config.max_depth, config.global_tokens) if config.global_tokens else None

    def new_session(self) -> SuffixSession:
        return SuffixSession(self.config, self.store)

    def reset(self) -> None:
        """Forget every earlier generation (benchmarks start each run from the same empty state)."""
        if self.store is not None:
            self.store.clear()
