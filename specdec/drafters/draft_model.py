"""An independent small causal LM that shares the target's tokenizer, drafting a chain or a tree.

The session keeps the draft model's own KV cache. Each `propose` first resynchronises: it keeps the
cache's longest prefix that still matches the committed context (drafts the target accepted stay,
rejected ones are cropped) and feeds the rest. A chain of k costs k draft forwards; a tree of width
w and depth d costs d forwards of up to w tokens each (tree attention inside the draft cache).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from specdec.core import kv
from specdec.core.sampling import sample, warp
from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.drafters.base import common_prefix_len
from specdec.errors import InvalidArgument
from specdec.models.runner import ModelRunner


@dataclass(frozen=True)
class DraftModelConfig:
    tree_width: int = 1  # 1 = a chain; w > 1 = w children per expanded node, the best w nodes expanded per level
    q_top_n: int = 0  # sampling: 0 = draw from the full q; N = draw from q truncated to its top N, renormalised

    def __post_init__(self) -> None:
        if self.tree_width < 1:
            raise InvalidArgument(f"tree_width must be >= 1, got {self.tree_width}")
        if self.q_top_n < 0:
            raise InvalidArgument(f"q_top_n must be >= 0 (0 = no truncation), got {self.q_top_n}")


def truncate_top_n(q: torch.Tensor, top_n: int) -> torch.Tensor:
    """q [vocab] restricted to its top_n entries and renormalised (0 or >= vocab: q unchanged).

    A drafter that sends only N entries of q over the wire must also sample from exactly this.
    """
    if top_n <= 0 or top_n >= q.shape[-1]:
        return q
    top = torch.topk(q, top_n)
    out = torch.zeros_like(q)
    out[top.indices] = top.values / top.values.sum()
    return out


def pick_children(logits: torch.Tensor, width: int, params: SamplingParams, generator: torch.Generator | None,
                  top_n: int = 0) -> list[tuple[int, torch.Tensor | None, float]]:
    """(token, q row, log-prob) for up to `width` children of one node; logits: [vocab].

    Greedy: the top-width tokens, q = None (one-hot). Sampling: `width` draws without replacement,
    each row's q being the distribution it was really drawn from (earlier picks zeroed, renormalised;
    with top_n > 0 the warped distribution is first truncated to its top_n entries).
    """
    if params.greedy:
        logprobs = torch.log_softmax(logits.float(), dim=-1)
        top = torch.topk(logprobs, width)
        return [(t, None, lp) for lp, t in zip(top.values.tolist(), top.indices.tolist())]  # one host copy each
    q = truncate_top_n(warp(logits, params), top_n)
    children = []
    for _ in range(width):
        token = sample(q, generator)
        children.append((token, q, math.log(max(float(q[token]), 1e-30))))
        rest = q.clone()
        rest[token] = 0.0
        total = float(rest.sum())
        if total <= 0.0:
            break
        q = rest / total
    return children


class DraftModelSession:
    def __init__(self, runner: ModelRunner, config: DraftModelConfig):
        self.runner = runner
        self.config = config
        self.cache = runner.new_cache()
        self.cached_ids: list[int] = []  # tokens whose keys/values are in self.cache

    def _sync(self, context_ids: list[int]) -> torch.Tensor:
        """Bring the cache to context_ids; return the draft logits after the last token: [vocab]."""
        keep = min(common_prefix_len(self.cached_ids, context_ids), len(context_ids) - 1)
        kv.crop(self.cache, keep)
        logits, _ = self.runner.forward(context_ids[keep:], self.cache)
        self.cached_ids = list(context_ids)
        return logits[-1]

    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        max_nodes = max_tokens * self.config.tree_width ** max_tokens if max_nodes is None else max_nodes
        if max_tokens <= 0 or max_nodes <= 0:
            return DraftTree.empty()
        if self.config.tree_width == 1:
            return self._chain(context_ids, min(max_tokens, max_nodes), params, generator)
        return self._tree(context_ids, max_tokens, max_nodes, params, generator)

    def _chain(self, context_ids, num_tokens, params, generator) -> DraftTree:
        logits = self._sync(context_ids)
        tokens, qs = [], []
        for i in range(num_tokens):
            (token, q, _), = pick_children(logits, 1, params, generator, self.config.q_top_n)
            tokens.append(token)
            if q is not None:
                qs.append(q)
            if i + 1 < num_tokens:  # the last draft token is never fed: the target verifies it
                logits, _ = self.runner.forward([token], self.cache)
                logits = logits[-1]
                self.cached_ids.append(token)
        return DraftTree.chain(tokens, torch.stack(qs) if qs else None)

    def _tree(self, context_ids, depth, max_nodes, params, generator) -> DraftTree:
        """Level by level: each frontier node draws `width` children, then the `width` best new nodes
        by cumulative log q become the next frontier. Nodes are listed in draw order and the tree
        stops at max_nodes, so a node's presence depends only on earlier draws (specdec.policy)."""
        width = self.config.tree_width
        frontier = [(-1, self._sync(context_ids))]  # (node, its draft logits); -1 = root
        num_context = len(context_ids)
        tokens, parents, qs, scores, depths = [], [], [], [], []
        fed: list[int] = []  # nodes fed into the draft cache after the context, in cache order
        for level in range(depth):
            new_nodes = []
            for parent, logits in frontier:
                base = scores[parent] if parent >= 0 else 0.0
                room = min(width, max_nodes - len(tokens))
                for token, q, logprob in pick_children(logits, room, params, generator, self.config.q_top_n):
                    new_nodes.append(len(tokens))
                    tokens.append(token)
                    parents.append(parent)
                    qs.append(q)
                    scores.append(base + logprob)
                    depths.append(level + 1)
            if level + 1 == depth or len(tokens) >= max_nodes:
                break
            expand = sorted(new_nodes, key=lambda n: -scores[n])[:width]
            logits = self._forward_nodes(expand, fed, parents, tokens, depths, num_context)
            fed.extend(expand)
            frontier = list(zip(expand, logits))
        kv.crop(self.cache, num_context)
        self.cached_ids = list(context_ids)
        q = None if params.greedy else torch.stack(qs)
        return DraftTree(tuple(tokens), tuple(parents), q)

    def _forward_nodes(self, nodes, fed, parents, tokens, depths, num_context) -> torch.Tensor:
        """Feed `nodes`, each attending to the context, its fed ancestors and itself -> logits [len(nodes), vocab]."""
        slot = {node: num_context + i for i, node in enumerate(fed)}
        num_kv = num_context + len(fed) + len(nodes)
        # laid out on the host (one entry per ancestor), copied to the draft model's device once
        sees = torch.zeros(1, 1, len(nodes), num_kv, dtype=torch.bool, device="cpu")
        sees[..., :num_context] = True
        for i, node in enumerate(nodes):
            sees[0, 0, i, num_context + len(fed) + i] = True
            ancestor = parents[node]
            while ancestor >= 0:
                sees[0, 0, i, slot[ancestor]] = True
                ancestor = parents[ancestor]
        device, dtype = self.runner.device, self.runner.dtype
        bias = torch.zeros(sees.shape, dtype=dtype, device=device).masked_fill_(
            ~sees.to(device, non_blocking=True), torch.finfo(dtype).min)
        positions = torch.tensor([[num_context - 1 + depths[n] for n in nodes]], device=device)
        logits, _ = self.runner.forward([tokens[n] for n in nodes], self.cache, attn_bias=bias, positions=positions)
        return logits


class DraftModelDrafter:
    name = "draft"

    def __init__(self, runner: ModelRunner, config: DraftModelConfig = DraftModelConfig()):
        self.runner = runner
        self.config = config

    def new_session(self) -> DraftModelSession:
        return DraftModelSession(self.runner, self.config)
