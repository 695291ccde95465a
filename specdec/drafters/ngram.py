"""Prompt lookup: propose what followed the most recent earlier occurrence of the context's last n-gram.

Free to run (a numpy scan of the context, no model), deterministic (q = one-hot), and strong on
prompts that get copied: code edits, JSON, quoting. As a tree it merges the continuations of
several distinct earlier matches into one trie, so the target checks them all in one forward.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument


@dataclass(frozen=True)
class NgramConfig:
    max_ngram: int = 3  # try the longest suffix first
    min_ngram: int = 2  # a 1-token match proposes mostly noise in chat text; each costs a wider verify
    num_branches: int = 1  # 1 = a chain; more = a trie of that many distinct continuations

    def __post_init__(self) -> None:
        if not 1 <= self.min_ngram <= self.max_ngram:
            raise InvalidArgument(f"need 1 <= min_ngram <= max_ngram, got {self.min_ngram}, {self.max_ngram}")
        if self.num_branches < 1:
            raise InvalidArgument(f"num_branches must be >= 1, got {self.num_branches}")


def find_continuations(context: np.ndarray, max_len: int, config: NgramConfig) -> list[np.ndarray]:
    """Up to num_branches distinct continuations (most recent match first) of the longest matching n-gram."""
    found: list[np.ndarray] = []
    seen: set[bytes] = set()
    for n in range(config.max_ngram, config.min_ngram - 1, -1):
        if len(context) <= n:
            continue
        # Windows starting before len - n: the suffix itself is not a match.
        windows = np.lib.stride_tricks.sliding_window_view(context[:-1], n)  # [len - n, n]
        hits = np.flatnonzero((windows == context[-n:]).all(axis=1))
        for start in hits[::-1]:
            cont = context[start + n: start + n + max_len]
            key = cont.tobytes()
            if len(cont) and key not in seen:
                seen.add(key)
                found.append(cont)
                if len(found) == config.num_branches:
                    return found
        if found:
            return found
    return found


class NgramSession:
    def __init__(self, config: NgramConfig):
        self.config = config

    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        max_nodes = max_tokens * self.config.num_branches if max_nodes is None else max_nodes  # a trie: at most this
        if max_tokens <= 0 or max_nodes <= 0:
            return DraftTree.empty()
        context = np.asarray(context_ids, dtype=np.int64)
        continuations = find_continuations(context, min(max_tokens, max_nodes), self.config)
        if len(continuations) == 1:
            return DraftTree.chain(continuations[0].tolist())
        tokens: list[int] = []
        parents: list[int] = []
        trie: dict[tuple[int, int], int] = {}  # (parent node, token) -> node
        for cont in continuations:
            parent = -1
            for token in cont.tolist():
                node = trie.get((parent, token))
                if node is None:
                    if len(tokens) == max_nodes:
                        break
                    node = trie[(parent, token)] = len(tokens)
                    tokens.append(token)
                    parents.append(parent)
                parent = node
        return DraftTree(tuple(tokens), tuple(parents))


class NgramDrafter:
    name = "ngram"

    def __init__(self, config: NgramConfig = NgramConfig()):
        self.config = config

    def new_session(self) -> NgramSession:
        return NgramSession(self.config)
