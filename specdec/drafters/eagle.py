"""EAGLE-style self-drafting: one decoder layer extrapolates the target's features, drafting a dynamic tree.

The session keeps the head's own KV cache over committed positions: pair t = (f_t, x_{t+1}) with
f_t the target's feature at t (the Sequence keeps them for every cached position) predicts f_{t+1},
which the target's LM head (restricted to the reduced vocabulary) turns into the distribution of
x_{t+2}. Committed tokens never change, so the cache only ever grows by the newly committed pairs;
draft nodes are cropped away after each proposal.

The tree is EAGLE-2's: at every depth the top_k nodes by cumulative draft log-probability are
expanded (one batched forward with tree attention inside the head's cache), each into its top_k
children; finally all nodes are reranked by cumulative log-probability and the best num_nodes
(parents always before children) are sent. Children are picked deterministically, so q = None.

Each node carries its path's draft probability as its score, so the speculation policy keeps the nodes
worth their verify rows (a wide tree costs a CPU twice a one-token forward). A level costs a head
forward, so drafting stops early once no new node's path probability reaches min_path_prob: nodes that
unlikely would rarely be verified, let alone accepted.
"""
from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path

import torch

from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.drafters.eagle_layer import EagleConfig, EagleHead, load_eagle
from specdec.drafters.trained import draft_dtype
from specdec.errors import InvalidArgument
from specdec.kernels.build import ROWS_AVX512, load_kernel
from specdec.kernels.linear import PackedLinear, install_with_rows


class EagleSession:
    needs_features = True  # the engine asks the Sequence to keep the target feature of every cached position
    scores_nodes = True  # nodes carry their path's draft probability: the policy sizes the tree by it

    def __init__(self, drafter: EagleDrafter):
        self.d = drafter
        self.sequence = None
        self.past: tuple[torch.Tensor, torch.Tensor] | None = None  # (k, v) [1, kv_heads, num_pairs, d]
        self.num_pairs = 0
        self.root_out: torch.Tensor | None = None  # [H] predicted feature at the root's position

    def attach(self, sequence) -> None:
        self.sequence = sequence
        self.past, self.num_pairs, self.root_out = None, 0, None

    def _features(self) -> torch.Tensor | None:
        chunks = getattr(self.sequence, "feature_chunks", None)
        if not chunks:
            return None
        if len(chunks) > 1:  # merge once, so later steps concatenate only the new rows
            chunks[:] = [torch.cat(chunks)]
        return chunks[0]  # [num_cached, H]

    @torch.inference_mode()
    def _sync(self, context_ids: list[int]) -> torch.Tensor | None:
        """Feed the newly committed pairs into the head's cache; return the root's predicted feature [H]."""
        feats = self._features()
        n = len(context_ids)
        if feats is None or feats.shape[0] != n - 1:
            return None
        m = self.num_pairs
        if m < n - 1:
            d = self.d
            out, self.past = d.head(feats[m:n - 1].to(d.dtype)[None], d.embed(context_ids[m + 1:n])[None],
                                    torch.arange(m, n - 1, device=d.device), self.past)
            self.num_pairs = n - 1
            self.root_out = out[0, -1]
        return self.root_out

    @torch.inference_mode()
    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        num_nodes = self.d.config.num_nodes if max_nodes is None else min(max_nodes, self.d.config.num_nodes)
        if max_tokens <= 0 or num_nodes <= 0:
            return DraftTree.empty()
        root_out = self._sync(context_ids)
        if root_out is None:
            return DraftTree.empty()
        d, c = self.d, self.d.config
        depth, k = min(c.depth, max_tokens), c.top_k
        min_logp = math.log(c.min_path_prob) if c.min_path_prob > 0 else -math.inf
        tokens, parents, scores, levels = [], [], [], []
        outputs: dict[int, torch.Tensor] = {}  # expanded node -> its predicted feature [H]
        slots: dict[int, int] = {}  # expanded node -> its entry in the head's cache
        past = self.past
        frontier = [(-1, root_out)]  # (node, predicted feature whose children to draft)
        for level in range(1, depth + 1):
            new_nodes = []
            top_values, top_indices = d.top_logps(d.draft_logits(torch.stack([f for _, f in frontier])), k)  # [F, k]
            for (parent, _), values, indices in zip(frontier, top_values, top_indices):
                base = scores[parent] if parent >= 0 else 0.0
                for lp, i in zip(values, indices):
                    new_nodes.append(len(tokens))
                    tokens.append(d.vocab_list[i])
                    parents.append(parent)
                    scores.append(base + lp)
                    levels.append(level)
            expand = sorted(new_nodes, key=lambda node: -scores[node])[:k]
            if level == depth or scores[expand[0]] < min_logp:
                break
            num_past = past[0].shape[2]
            mask = torch.zeros(len(expand), num_past + len(expand), dtype=torch.bool, device="cpu")  # built on the host
            mask[:, :self.num_pairs] = True
            for row, node in enumerate(expand):
                mask[row, num_past + row] = True
                ancestor = parents[node]
                while ancestor >= 0:
                    mask[row, slots[ancestor]] = True
                    ancestor = parents[ancestor]
            feats = torch.stack([outputs[parents[n]] if parents[n] >= 0 else root_out for n in expand])  # [E, H]
            positions = torch.full((len(expand),), self.num_pairs - 1 + level, device=d.device)
            out, past = d.head(feats[None], d.embed([tokens[n] for n in expand])[None], positions, past,
                               mask.to(d.device, non_blocking=True))
            for row, node in enumerate(expand):
                outputs[node] = out[0, row]
                slots[node] = num_past + row
            frontier = [(node, outputs[node]) for node in expand]
        return rerank(tokens, parents, scores, levels, num_nodes)


def kernel_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """sdpa_attend's contract (q [B, heads, n, d], k / v [B, kv_heads, L, d], mask bool [n, L] or None:
    causal) on specdec's attention kernel, which reads grouped keys in place; the mask becomes additive."""
    bias = None
    if mask is not None:
        bias = torch.zeros(mask.shape, dtype=torch.float32).masked_fill_(~mask, float("-inf"))[None, None]
    return load_kernel().module.attend(q, k, v, bias, q.shape[-1] ** -0.5)


def rerank(tokens: list[int], parents: list[int], scores: list[float], levels: list[int],
           num_nodes: int) -> DraftTree:
    """The best num_nodes nodes by cumulative log-probability, parents kept before children; each
    node's score is its path's probability, exp(cumulative log-probability)."""
    keep: set[int] = set()
    for node in sorted(range(len(tokens)), key=lambda n: (-scores[n], levels[n])):
        if len(keep) >= num_nodes:
            break
        if parents[node] < 0 or parents[node] in keep:
            keep.add(node)
    order = sorted(keep, key=lambda n: (levels[n], n))
    index = {node: i for i, node in enumerate(order)}
    return DraftTree(tuple(tokens[n] for n in order),
                     tuple(index[parents[n]] if parents[n] >= 0 else -1 for n in order), None,
                     tuple(math.exp(scores[n]) for n in order))


class EagleDrafter:
    def __init__(self, head: EagleHead, vocab_ids: torch.Tensor, embed_weight: torch.Tensor,
                 head_weight: torch.Tensor, config: EagleConfig):
        self.name = "eagle3" if config.feature_layers else "eagle"
        self.feature_layers = config.feature_layers  # the engine's runner keeps these layers' states (EAGLE-3)
        self.device = embed_weight.device  # the head runs where the target's features are
        self.head = head.to(self.device)
        self.config = config
        self.vocab_ids = vocab_ids.to(self.device)  # [V']
        self.vocab_list = vocab_ids.tolist()  # the same on the host: drafted tokens are read there
        self.embed_weight = embed_weight  # [vocab, H] the target's input embeddings
        self.head_weight = head_weight[self.vocab_ids].contiguous()  # [V', H] rows of the target's LM head
        self.dtype = head_weight.dtype
        self.lm_rows = lambda x: x @ self.head_weight.T  # [.., H] -> [.., V'] (use_kernels may repack it)
        self.top_kernel = None  # specdec/kernels/top_probs.cpp where it runs in AVX-512 (use_kernels)

    def use_kernels(self, mode: str, attention: bool) -> None:
        """The head's linear layers and its reduced LM head on the kernel `mode` resolves to, as the
        target's: a draft step is a few rows, which torch's matmul streams the weights for again each time.
        attention: the target's attention runs on specdec's kernel, so the head's does too (grouped heads
        read in place, no repeated keys; ~0.3 ms less per head forward than torch's sdpa here)."""
        self.lm_rows = install_with_rows(self.head, self.head_weight, mode)
        self.top_kernel = load_kernel().rows_avx512 if isinstance(self.lm_rows, PackedLinear) else None
        if attention:
            self.head.attend = kernel_attend

    def draft_logits(self, features: torch.Tensor) -> torch.Tensor:
        """[F, H] predicted features -> [F, V'] logits over the reduced vocabulary."""
        return self.lm_rows(self.head.lm_input(features))

    def top_logps(self, logits: torch.Tensor, k: int) -> tuple[list[list[float]], list[list[int]]]:
        """logits [F, V'] -> each row's k best (log-probabilities, indices into V'), best first, on the host;
        one kernel call where it runs (ties: the lower index first), else log_softmax and topk."""
        if self.top_kernel is not None:
            indices, logps = self.top_kernel.top_probs(logits, k, ROWS_AVX512, log=True)
            return logps.tolist(), indices.tolist()
        top = torch.topk(torch.log_softmax(logits.float(), dim=-1), k, dim=-1)
        return top.values.tolist(), top.indices.tolist()

    def embed(self, token_ids: list[int]) -> torch.Tensor:
        return self.embed_weight[torch.tensor(token_ids, dtype=torch.long, device=self.device)].to(self.dtype)  # [n, H]

    @classmethod
    def load(cls, path: Path, model, runner, num_nodes: int = 0, top_k: int = 0, depth: int = 0,
             min_path_prob: float | None = None, fused: bool = False) -> EagleDrafter:
        """fused: the caller asked for an EAGLE-3-style head (drafter eagle3), which `path` must hold;
        num_nodes, top_k, depth: 0 = the checkpoint's; min_path_prob: None = the checkpoint's."""
        head_dtype = draft_dtype(runner)
        head, vocab_ids = load_eagle(path, head_dtype)
        config = head.c
        if fused != bool(config.feature_layers):
            want, got = ("eagle3", "eagle") if fused else ("eagle", "eagle3")
            raise InvalidArgument(f"{str(path)!r} holds an {got} head, not an {want} one")
        if any(k < 1 or k >= runner.config.num_hidden_layers for k in config.feature_layers):
            raise InvalidArgument(f"the EAGLE-3 head in {str(path)!r} reads layers the target lacks")
        if runner.head_weight is None or config.hidden_size != runner.head_weight.shape[1] \
                or config.target_vocab_size != runner.vocab_size:
            raise InvalidArgument(f"the EAGLE head in {str(path)!r} was trained for another target")
        overrides = {name: v for name, v in (("num_nodes", num_nodes), ("top_k", top_k), ("depth", depth)) if v}
        if any(v < 0 for v in overrides.values()):
            raise InvalidArgument(f"eagle options must be positive, got {overrides}")
        if min_path_prob is not None:
            if not 0.0 <= min_path_prob < 1.0:
                raise InvalidArgument(f"eagle option min_path_prob must be in [0, 1), got {min_path_prob}")
            overrides["min_path_prob"] = float(min_path_prob)
        config = replace(config, **overrides)
        drafter = cls(head, vocab_ids, model.get_input_embeddings().weight, runner.head_weight.to(head_dtype), config)
        drafter.use_kernels(runner.run_config.linear_kernel, runner.attention_kernel)
        return drafter

    def new_session(self) -> EagleSession:
        return EagleSession(self)
