"""Medusa-1 heads: self-drafting from the hidden state the verify forward already produced.

Head i (0-based) reads the target's last hidden state h_t at the last accepted row (whose LM-head
output became the new root x_{t+1}) and predicts x_{t+2+i} through one residual block
h + SiLU(W_i h + b_i) and the target's own (frozen, shared) LM head, restricted to a reduced
vocabulary (FR-Spec). The tree is static and given as Medusa path tuples: path (a, b) is the a-th
candidate of head 0 followed by the b-th candidate of head 1. Candidates are picked
deterministically (top-k), so q = None (one-hot) and verification stays exact at any temperature.
Drafting costs K small matmuls and no model call.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.core.tree import DraftTree, paths_to_parents
from specdec.core.types import SamplingParams
from specdec.drafters.trained import draft_dtype
from specdec.errors import InvalidArgument, ModelNotFound
from specdec.kernels.build import ROWS_AVX512, load_kernel
from specdec.kernels.linear import PackedLinear, install_with_rows
from specdec.kernels.packing import TILE

WEIGHTS = "medusa.safetensors"
CONFIG = "medusa_config.json"


@dataclass(frozen=True)
class MedusaConfig:
    num_heads: int
    hidden_size: int
    target_vocab_size: int
    tree_paths: tuple[tuple[int, ...], ...] = ((0,),)  # ordered by measured acceptance, best first

    def __post_init__(self) -> None:
        if self.num_heads < 1:
            raise InvalidArgument(f"num_heads must be >= 1, got {self.num_heads}")
        if any(len(p) > self.num_heads for p in self.tree_paths):
            raise InvalidArgument(f"a tree path is deeper than the {self.num_heads} heads")


class MedusaHeads(torch.nn.Module):
    def __init__(self, num_heads: int, hidden_size: int):
        super().__init__()
        self.blocks = torch.nn.ModuleList(torch.nn.Linear(hidden_size, hidden_size) for _ in range(num_heads))
        for block in self.blocks:  # start as the identity: every head first predicts what the LM head does
            torch.nn.init.zeros_(block.weight)
            torch.nn.init.zeros_(block.bias)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, H] -> per-head features [n, num_heads, H] (the LM head turns them into logits)."""
        return torch.stack([hidden + torch.nn.functional.silu(block(hidden)) for block in self.blocks], dim=1)


def save_medusa(out: Path, heads: MedusaHeads, vocab_ids: torch.Tensor, config: MedusaConfig) -> None:
    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in heads.state_dict().items()}
    tensors["vocab_ids"] = vocab_ids.to(torch.int32)
    save_file(tensors, str(out / WEIGHTS))
    (out / CONFIG).write_text(json.dumps({"num_heads": config.num_heads, "hidden_size": config.hidden_size,
                                          "target_vocab_size": config.target_vocab_size,
                                          "tree_paths": [list(p) for p in config.tree_paths]}))


def load_medusa(path: Path, dtype: torch.dtype) -> tuple[MedusaHeads, torch.Tensor, MedusaConfig]:
    path = Path(path)
    if not (path / WEIGHTS).is_file() or not (path / CONFIG).is_file():
        raise ModelNotFound(f"{str(path)!r} holds no Medusa heads ({WEIGHTS} + {CONFIG})")
    raw = json.loads((path / CONFIG).read_text())
    config = MedusaConfig(raw["num_heads"], raw["hidden_size"], raw["target_vocab_size"],
                          tuple(tuple(p) for p in raw["tree_paths"]))
    tensors = load_file(str(path / WEIGHTS))
    vocab_ids = tensors.pop("vocab_ids").long()
    heads = MedusaHeads(config.num_heads, config.hidden_size)
    heads.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})
    return heads.to(dtype).eval().requires_grad_(False), vocab_ids, config


@dataclass(frozen=True)
class HeadGuesses:
    """The heads' top candidates for one hidden state, worked out ahead (MedusaDrafter.prepare)."""
    hidden: torch.Tensor  # the sequence's `hidden` they were computed from (identity: still current?)
    top: torch.Tensor  # [heads, R] indices into the reduced vocabulary, best first
    probs: torch.Tensor  # [heads, R] each head's probability of those candidates


class MedusaSession:
    # Every tree is scored (a node: the product of its heads' probabilities along its path), so the
    # speculation policy keeps the nodes worth their verify cost, as it does for EAGLE's trees: a static
    # tree of many ranked paths is then cheap where verify rows are (bf16), cut to a few where they are
    # not (float32), instead of one fixed size for every machine.
    scores_nodes = True

    def __init__(self, drafter: MedusaDrafter):
        self.drafter = drafter
        self.batch_owner = drafter  # sessions of one drafter draft faster together (prepare)
        self.sequence = None  # the target's Sequence, whose `hidden` the heads read
        self.ready: HeadGuesses | None = None

    def attach(self, sequence) -> None:
        """Self-drafting: the engine hands over the target's sequence state (hidden at the last accepted row)."""
        self.sequence = sequence

    def propose(self, context_ids: list[int], max_tokens: int, params: SamplingParams,
                generator: torch.Generator | None, max_nodes: int | None = None) -> DraftTree:
        return self.draft(max_tokens, max_nodes)

    @torch.inference_mode()
    def draft(self, max_tokens: int, max_nodes: int | None) -> DraftTree:
        """The static tree filled from the heads' top candidates, each node scored with the product,
        along its path, of the heads' probabilities of its candidates (each head's marginal, so a rough
        estimate of the path's acceptance, which the policy calibrates per depth against what was
        accepted; the hybrid drafter weighs them against suffix decoding's)."""
        hidden = getattr(self.sequence, "hidden", None)  # [H]
        if max_tokens <= 0 or hidden is None:
            return DraftTree.empty()
        d = self.drafter
        shape = d.tree_shape(max_tokens, max_nodes)
        if shape is None:
            return DraftTree.empty()
        ready, self.ready = self.ready, None
        if ready is None or ready.hidden is not hidden or ready.top.shape[0] < shape.num_heads:
            ready = d.guesses([hidden], shape.num_heads)[0]
        top = ready.top[:shape.num_heads]  # [heads used, R]
        candidates = top.flatten().tolist()  # [heads used * R] indices into the reduced vocabulary
        tokens = tuple(d.vocab_list[candidates[i]] for i in shape.picks)  # target token ids
        probs = ready.probs[:shape.num_heads].flatten().tolist()  # [heads used * R]
        scores = []
        for node, parent in enumerate(shape.parents):  # a path's product: its parent's times its own pick
            score = probs[shape.picks[node]] * (scores[parent] if parent >= 0 else 1.0)
            scores.append(min(1.0, max(0.0, score)))
        return DraftTree(tokens, shape.parents, None, tuple(scores))


@dataclass(frozen=True)
class TreeShape:
    """A draft's static tree for one (depth, node budget): the same every step, so worked out once.
    picks[node]: its candidate's index in the flattened [head, rank] top-k (head = its depth - 1)."""
    parents: tuple[int, ...]
    picks: tuple[int, ...]
    num_heads: int  # heads the tree reaches: the deeper ones need not run


def _best_paths(paths: list[tuple[int, ...]], max_depth: int, max_nodes: int) -> list[tuple[int, ...]]:
    """The first max_nodes paths (best first) no deeper than max_depth whose parent path is kept."""
    kept: list[tuple[int, ...]] = []
    for path in paths:
        if len(kept) == max_nodes:
            break
        if len(path) <= max_depth and (len(path) == 1 or path[:-1] in kept):
            kept.append(path)
    return kept


class MedusaDrafter:
    name = "medusa"

    def __init__(self, heads: MedusaHeads, vocab_ids: torch.Tensor, target_head_weight: torch.Tensor,
                 config: MedusaConfig, num_nodes: int = 0):
        device = target_head_weight.device  # the heads run where the target's features are
        self.heads = heads.to(device)
        self.vocab_ids = vocab_ids.to(device)  # [V'] the reduced vocabulary
        self.vocab_list = vocab_ids.tolist()  # the same on the host: a draft maps its few picks in Python
        self.head_weight = target_head_weight[self.vocab_ids].contiguous()  # [V', H] rows of the target's LM head
        self.config = config
        self.paths = list(config.tree_paths[:num_nodes] if num_nodes > 0 else config.tree_paths)
        self.max_rank = max(max(p) for p in self.paths)
        self.lm_rows = lambda x: x @ self.head_weight.T  # [.., H] -> [.., V'] (use_kernels may repack it)
        self.fused: PackedLinear | None = None  # the heads' blocks as one product (use_kernels)
        self.top_kernel = None  # specdec/kernels/top_probs.cpp where it runs in AVX-512 (use_kernels)
        self._shapes: dict[tuple[int, int | None], TreeShape | None] = {}

    def use_kernels(self, mode: str) -> None:
        """The heads and the reduced LM head on the kernel `mode` resolves to, as the target's; on
        specdec's kernel the K blocks also become one packed [K*H, H] product: a draft step was K
        kernel calls and ~3K tensor ops, where one call streams the same weights."""
        blocks = self.heads.blocks
        weight = torch.cat([b.weight for b in blocks])  # [K*H, H], read before install packs them
        bias = torch.cat([b.bias for b in blocks])
        self.lm_rows = install_with_rows(self.heads, self.head_weight, mode)
        self.fused = PackedLinear(weight, bias) if isinstance(blocks[0], PackedLinear) else None
        self.top_kernel = load_kernel().rows_avx512 if self.fused is not None else None

    def features(self, hidden: torch.Tensor, num_heads: int) -> torch.Tensor:
        """hidden [n, H] -> the first num_heads heads' features [n, num_heads, H]: h + SiLU(W_i h + b_i)
        each, the same values MedusaHeads.forward gives (per-output products, then the same two ops)."""
        hidden = hidden.to(self.head_weight.dtype)
        n, size = hidden.shape
        if self.fused is None or (num_heads < len(self.heads.blocks) and size % TILE):
            return self.heads(hidden)[:, :num_heads]
        y = self.fused(hidden, num_out=num_heads * size).view(n, num_heads, size)
        return hidden[:, None] + torch.nn.functional.silu(y)

    @torch.inference_mode()
    def guesses(self, hiddens: list[torch.Tensor], num_heads: int) -> list[HeadGuesses]:
        """The first num_heads heads' top candidates for each hidden state [H], all in one product per
        weight: in a batch of n sequences the heads' and the reduced LM head's weights (~12 MB in
        bf16 for SmolLM2) stream once instead of n times. specdec's kernel computes each row alone
        (row-invariant), so a sequence's guesses are the same bits with or without the others."""
        rows = hiddens[0][None] if len(hiddens) == 1 else torch.stack(hiddens)  # [n, H]
        logits = self.lm_rows(self.features(rows, num_heads))  # [n, heads, V']
        n, rank = len(hiddens), self.max_rank + 1
        if self.top_kernel is not None:  # one call for what takes torch ~10 ops (ties: the lower index first)
            top, probs = self.top_kernel.top_probs(logits.view(n * num_heads, -1), rank, ROWS_AVX512)
            top, probs = top.view(n, num_heads, rank), probs.view(n, num_heads, rank)
        else:
            top = torch.topk(logits, rank, dim=-1).indices  # [n, heads, R]
            probs = torch.softmax(logits.float(), dim=-1).gather(2, top)  # [n, heads, R]
        return [HeadGuesses(h, t, p) for h, t, p in zip(hiddens, top, probs)]

    def prepare(self, sessions: list[tuple[MedusaSession, int, int | None]]) -> None:
        """(session, depth, max_nodes) of one step's sequences: their guesses together, kept in each
        session for its draft() that follows."""
        wanted = [(s, shape.num_heads) for s, depth, nodes in sessions
                  if getattr(s.sequence, "hidden", None) is not None and depth > 0
                  and (shape := self.tree_shape(depth, nodes)) is not None]
        if len(wanted) < 2:
            return
        guesses = self.guesses([s.sequence.hidden for s, _ in wanted], max(n for _, n in wanted))
        for (session, _), ready in zip(wanted, guesses):
            session.ready = ready

    def tree_shape(self, max_depth: int, max_nodes: int | None) -> TreeShape | None:
        """The static tree cut to max_depth and max_nodes (None: all paths), or None when nothing is left."""
        key = (max_depth, max_nodes)
        if key not in self._shapes:
            paths = _best_paths(self.paths, max_depth, len(self.paths) if max_nodes is None else max_nodes)
            if not paths:
                self._shapes[key] = None
            else:
                parents, ranks = paths_to_parents(paths)
                ordered = sorted(paths, key=lambda p: (len(p), p))  # paths_to_parents' node order
                width = self.max_rank + 1
                picks = tuple((len(p) - 1) * width + r for p, r in zip(ordered, ranks))
                self._shapes[key] = TreeShape(parents, picks, max(len(p) for p in paths))
        return self._shapes[key]

    @classmethod
    def load(cls, path: Path, runner, num_nodes: int = 0) -> MedusaDrafter:
        """runner: the target's ModelRunner (its LM head is the heads' shared LM head). The heads and their
        rows of it run in draft_dtype: bfloat16 beside a float32 target where the CPU multiplies it natively."""
        dtype = draft_dtype(runner)
        heads, vocab_ids, config = load_medusa(path, dtype)
        if runner.head_weight is None or config.hidden_size != runner.head_weight.shape[1] \
                or config.target_vocab_size != runner.vocab_size:
            raise InvalidArgument(f"Medusa heads in {str(path)!r} were trained for another target "
                                  f"(hidden {config.hidden_size}, vocab {config.target_vocab_size})")
        drafter = cls(heads, vocab_ids, runner.head_weight.to(dtype), config, num_nodes)
        drafter.use_kernels(runner.run_config.linear_kernel)
        return drafter

    def new_session(self) -> MedusaSession:
        return MedusaSession(self)
