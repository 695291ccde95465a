"""Draft trees on the wire (torch side: draft and target workers only).

q travels sparse: each node's non-zero probabilities. A drafter that truncates its distribution to
the top N and samples from that renormalised truncation sends exactly what it sampled from in N
entries, which keeps verification exact and messages small (docs/architecture.md, "The contract").
`tree_from_pb` is where the target refuses a malformed distribution, with a reason, and renormalises
an accepted one exactly (verification divides by q: a q off by 1e-3 would skew acceptance by as much).
"""
from __future__ import annotations

import math

import torch

from specdec.core.tree import DraftTree
from specdec.errors import InvalidArgument
from specdec.rpc.v1 import target_pb2

PROB_SUM_TOLERANCE = 1e-3


def tree_to_pb(tree: DraftTree) -> target_pb2.DraftTree:
    msg = target_pb2.DraftTree(token_ids=list(tree.token_ids), parent_ids=list(tree.parent_ids))
    if tree.q is not None:
        for row in tree.q.float().cpu():  # [vocab]; the whole q leaves the drafter's device in one copy
            ids = torch.nonzero(row).flatten()
            msg.q.add(token_ids=ids.tolist(), probs=row[ids].tolist())
    return msg


def tree_from_pb(msg: target_pb2.DraftTree, vocab_size: int, max_nodes: int) -> DraftTree:
    """A validated DraftTree; raises InvalidArgument saying what is wrong."""
    token_ids, parent_ids = tuple(msg.token_ids), tuple(msg.parent_ids)
    DraftTree(token_ids, parent_ids).validate(vocab_size, max_nodes)
    if not msg.q:
        return DraftTree(token_ids, parent_ids)
    if len(msg.q) != len(token_ids):
        raise InvalidArgument(f"draft has {len(msg.q)} q rows for {len(token_ids)} nodes")
    q = torch.zeros(len(token_ids), vocab_size, dtype=torch.float32, device="cpu")  # [num_nodes, vocab]; to the
    # target's device once, when its sequence is verified
    for node, row in enumerate(msg.q):
        if len(row.token_ids) != len(row.probs) or not row.token_ids:
            raise InvalidArgument(f"draft node {node}: q has {len(row.token_ids)} token ids and {len(row.probs)} probs")
        if len(set(row.token_ids)) != len(row.token_ids):
            raise InvalidArgument(f"draft node {node}: q names a token twice")
        ids = torch.tensor(list(row.token_ids), dtype=torch.long, device="cpu")
        probs = torch.tensor(list(row.probs), dtype=torch.float32, device="cpu")
        if int(ids.min()) < 0 or int(ids.max()) >= vocab_size:
            raise InvalidArgument(f"draft node {node}: q names a token outside the vocabulary [0, {vocab_size})")
        if not bool(torch.isfinite(probs).all()) or float(probs.min()) < 0.0:
            raise InvalidArgument(f"draft node {node}: q has a negative or non-finite probability")
        total = probs.double().sum()
        if not math.isclose(float(total), 1.0, abs_tol=PROB_SUM_TOLERANCE):
            raise InvalidArgument(f"draft node {node}: q sums to {float(total):.6f}, not 1")
        # A drafter samples with torch.multinomial, which draws in proportion to the weights it is
        # given: the distribution it drew from is probs / sum, whatever rounding left in the sum.
        q[node, ids] = (probs.double() / total).float()
        if float(q[node, token_ids[node]]) <= 0.0:
            raise InvalidArgument(f"draft node {node}: its token {token_ids[node]} has probability 0 under its q")
    return DraftTree(token_ids, parent_ids, q)
