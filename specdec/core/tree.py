"""Draft trees as plain data, and everything derived from their shape.

A draft tree holds `num_nodes` candidate tokens. `parent_ids[i]` is the index of node i's parent, or
-1 when its parent is the root: the last committed token, which the verify forward feeds first.
Parents come before children (parent_ids[i] < i), so a chain of k tokens is (-1, 0, 1, ..., k-2).
The verify forward's input is therefore `[root] + token_ids`; "row" r below indexes that input
(row 0 = root, row i + 1 = node i).

From the shape alone (Medusa's habit) we derive, once per shape: depths, children per row, the tree
attention mask (each row sees itself and its ancestors), position ids and retrieve indices.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import torch

from specdec.errors import InvalidArgument


@dataclass(frozen=True)
class DraftTree:
    """Candidate tokens proposed by a drafter.

    token_ids: [num_nodes] candidate tokens.
    parent_ids: [num_nodes] parent node index, -1 for children of the root.
    q: [num_nodes, vocab] float, row i = the exact distribution node i's token was drawn from
       (given its parent and its earlier siblings), or None when the drafter picked tokens
       deterministically (q = one-hot). Greedy verification ignores q.
    scores: [num_nodes] the drafter's own estimate of the probability that node i's whole path is
       accepted (so their sum is the tokens it expects accepted), or None. A drafter that knows how
       far to trust each guess (suffix decoding: how long and how frequent its match) says so here,
       and the speculation policy sizes the tree by it instead of by its one acceptance rate.
    """

    token_ids: tuple[int, ...]
    parent_ids: tuple[int, ...]
    q: torch.Tensor | None = None
    scores: tuple[float, ...] | None = None

    @property
    def num_nodes(self) -> int:
        return len(self.token_ids)

    @staticmethod
    def empty() -> DraftTree:
        return DraftTree((), ())

    @staticmethod
    def chain(token_ids: list[int] | tuple[int, ...], q: torch.Tensor | None = None) -> DraftTree:
        return DraftTree(tuple(int(t) for t in token_ids), tuple(range(-1, len(token_ids) - 1)), q)

    def validate(self, vocab_size: int, max_nodes: int) -> None:
        """Refuse a malformed tree with a reason (it must never reach the cache)."""
        if len(self.token_ids) != len(self.parent_ids):
            raise InvalidArgument(
                f"draft tree has {len(self.token_ids)} tokens but {len(self.parent_ids)} parent ids")
        if self.num_nodes > max_nodes:
            raise InvalidArgument(f"draft tree has {self.num_nodes} nodes, more than the limit {max_nodes}")
        for i, (token, parent) in enumerate(zip(self.token_ids, self.parent_ids)):
            if not 0 <= token < vocab_size:
                raise InvalidArgument(f"draft node {i} has token id {token} outside the vocabulary [0, {vocab_size})")
            if not -1 <= parent < i:
                raise InvalidArgument(f"draft node {i} has parent index {parent}; it must be in [-1, {i})")
        if self.scores is not None and (len(self.scores) != self.num_nodes
                                        or not all(0.0 <= s <= 1.0 for s in self.scores)):
            raise InvalidArgument(f"draft scores must be {self.num_nodes} probabilities in [0, 1]")
        if self.q is not None and tuple(self.q.shape) != (self.num_nodes, vocab_size):
            raise InvalidArgument(f"draft q has shape {tuple(self.q.shape)}, expected ({self.num_nodes}, {vocab_size})")


@dataclass(frozen=True)
class TreeLayout:
    """What the verify forward and the verifier need from a tree's shape (rows include the root)."""

    parent_rows: tuple[int, ...]  # [num_rows] parent row of each row; -1 for the root
    depths: tuple[int, ...]  # [num_rows] root depth 0
    children: tuple[tuple[int, ...], ...]  # [num_rows] child rows, in node order
    is_chain: bool
    mask: torch.Tensor  # [num_rows, num_rows] bool, True where row r may attend to row c

    @property
    def num_rows(self) -> int:
        return len(self.depths)


def node_depths(parent_ids) -> list[int]:
    """Each node's depth (a root's child: 1); parents come before their children."""
    depths: list[int] = []
    for parent in parent_ids:
        depths.append(1 if parent < 0 else depths[parent] + 1)
    return depths


@lru_cache(maxsize=256)
def tree_layout(parent_ids: tuple[int, ...]) -> TreeLayout:
    """Derive the layout of a tree shape; cached because static trees repeat every step."""
    parent_rows = (-1,) + tuple(p + 1 for p in parent_ids)
    num_rows = len(parent_rows)
    depths = [0] * num_rows
    children: list[list[int]] = [[] for _ in range(num_rows)]
    mask = torch.zeros(num_rows, num_rows, dtype=torch.bool, device="cpu")  # host data, moved once per step
    mask[0, 0] = True
    for row in range(1, num_rows):
        parent = parent_rows[row]
        depths[row] = depths[parent] + 1
        children[parent].append(row)
        mask[row] = mask[parent]
        mask[row, row] = True
    is_chain = parent_ids == tuple(range(-1, len(parent_ids) - 1))
    return TreeLayout(parent_rows, tuple(depths), tuple(tuple(c) for c in children), is_chain, mask)


def attention_bias(layout: TreeLayout, num_cached: int, dtype: torch.dtype,
                   device: torch.device | str = "cpu") -> torch.Tensor:
    """Additive mask for one verify forward: [1, 1, num_rows, num_cached + num_rows], 0 or -inf.

    Every row sees the whole committed prefix (the cache) and, inside the tree, itself and its ancestors.
    """
    bias = torch.zeros(1, 1, layout.num_rows, num_cached + layout.num_rows, dtype=dtype, device=device)
    bias[0, 0, :, num_cached:].masked_fill_(~layout.mask.to(device, non_blocking=True), torch.finfo(dtype).min)
    return bias


def position_ids(layout: TreeLayout, num_cached: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """[1, num_rows]: a node's position is the root's position plus its depth."""
    return (torch.tensor(layout.depths, dtype=torch.long, device=device) + num_cached).unsqueeze(0)


def retrieve_indices(layout: TreeLayout) -> torch.Tensor:
    """[num_leaves, max_depth + 1] rows along each root-to-leaf path, padded with -1 (Medusa's form)."""
    leaves = [r for r in range(layout.num_rows) if not layout.children[r]]
    max_depth = max(layout.depths)
    out = torch.full((len(leaves), max_depth + 1), -1, dtype=torch.long, device="cpu")
    for i, leaf in enumerate(leaves):
        path = []
        row = leaf
        while row != -1:
            path.append(row)
            row = layout.parent_rows[row]
        out[i, : len(path)] = torch.tensor(path[::-1], device="cpu")
    return out


def paths_to_parents(paths: list[tuple[int, ...]]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Medusa-style path tuples -> (parent_ids, ranks).

    A path (a, b) is the node reached by taking the a-th candidate at depth 1, then the b-th at depth 2;
    its rank is b: which of its drafter's top candidates fills it. Every prefix of a path must be a path.
    """
    ordered = sorted({tuple(p) for p in paths}, key=lambda p: (len(p), p))
    index = {path: i for i, path in enumerate(ordered)}
    parents, ranks = [], []
    for path in ordered:
        if not path or any(r < 0 for r in path):
            raise InvalidArgument(f"tree path {path} must be a non-empty tuple of non-negative ranks")
        if len(path) > 1 and path[:-1] not in index:
            raise InvalidArgument(f"tree path {path} has no parent path {path[:-1]}")
        parents.append(index[path[:-1]] if len(path) > 1 else -1)
        ranks.append(path[-1])
    return tuple(parents), tuple(ranks)
