"""The one interface every independent drafter implements.

A drafter is shared; a session holds one sequence's drafting state (e.g. the draft model's KV
cache). `propose` receives the whole committed context every time, so a session resynchronises
itself: it keeps whatever prefix of its own state still matches and rebuilds the rest. That makes
rollback after a rejection, a stale draft or a restarted draft worker the same code path.
"""
from __future__ import annotations

from typing import Protocol

import torch

from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams


class DraftSession(Protocol):
    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        """A draft tree continuing context_ids (prompt + generated, last token = verify root).

        max_tokens bounds the depth and max_nodes the node count (the speculation policy's budget,
        None = the drafter's own limit); returning fewer nodes, or an empty tree, is always allowed.
        In sampling mode each node's q row is the exact distribution its token was drawn from, and
        two rules keep cut trees exact (specdec.policy): nodes are listed in the order they were
        drawn, and whether a node is in the tree depends only on draws made before its own.
        """
        ...


class Drafter(Protocol):
    name: str

    def new_session(self) -> DraftSession:
        ...


def common_prefix_len(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n
