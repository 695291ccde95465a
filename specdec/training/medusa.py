"""Medusa-1 recipe: train residual heads on cached target features, then choose the tree by measurement.

Frozen target: only the heads learn. Head i at position t is trained to predict next_ids[t + 1 + i]
(the target's greedy token two-plus-i steps ahead) through the shared LM head restricted to the
reduced vocabulary. The tree is then grown greedily on held-out sequences: with greedy verification
at most one node per depth can be right, so a tree's expected accepted length is the sum over its
paths of P(path fully right); adding paths by that measured probability (every prefix first) is
therefore the best tree for each node budget.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec.drafters.medusa import MedusaConfig, MedusaHeads, load_medusa, save_medusa
from specdec.errors import InvalidArgument
from specdec.training.common import (BestKeeper, Budget, learning_rate, positions_with_offsets, prepare,
                                     save_loss_curve, skip_prompt_start, to_reduced, write_recipe)
from specdec.training.features import FeatureSet


@dataclass(frozen=True)
class MedusaRecipe:
    num_heads: int = 4
    vocab_size: int = 8192  # reduced draft vocabulary (most frequent target tokens)
    batch_size: int = 256  # positions per step
    lr: float = 1e-3
    warmup_steps: int = 1  # none: the heads start as the identity (the LM head's own guess), a sound start
    # "constant": lr throughout (the first, 10-minute heads); "cosine": down to lr * min_lr_ratio over the budget
    # (a long run: the last gains come once the step size shrinks)
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.0
    head_decay: float = 0.8  # loss weight of head i is head_decay ** i (later heads are less certain)
    num_tree_nodes: int = 48  # paths of the shipped tree, ranked; the engine's policy cuts each step's tree
    # Extra verify time per node relative to a 1-token forward, to cut the shipped tree to a fixed size
    # (0: ship all num_tree_nodes). The policy sizes every scored tree from measured costs at run time, so
    # a fixed cut only loses paths where verify rows are cheap (bf16); the first heads shipped 8 paths
    # cut at 0.022 (float32 SmolLM2 on an AVX-512 CPU: 16 tokens ~1.35x one token).
    verify_cost_per_node: float = 0.0
    max_rank: int = 8  # candidates per head considered for the tree
    num_heldout_seqs: int = 12
    eval_every: int = 100  # steps between held-out checks (early stopping)
    seed: int = 0


def head_logits(heads: MedusaHeads, feats: torch.Tensor, head_weight: torch.Tensor) -> torch.Tensor:
    """feats [n, H] -> [n, K, V'] logits over the reduced vocabulary."""
    return heads(feats) @ head_weight.T


def train_medusa(fs: FeatureSet, head_weight_full: torch.Tensor, recipe: MedusaRecipe, budget: Budget,
                 out: Path, extra: dict | None = None, init: Path | None = None) -> dict:
    """Train, choose the tree, save heads + config + loss curve + recipe into `out`; return the summary.

    init: a Medusa checkpoint the heads start from instead of the identity (a run continued on new text
    with a fresh optimizer; the heads read hidden states, so the reduced vocabulary is chosen afresh)."""
    gen, train, heldout, vocab_ids = prepare(fs, recipe)
    full_vocab = head_weight_full.shape[0]
    head_weight = head_weight_full[vocab_ids].float()  # [V', H] frozen
    hidden_size = head_weight.shape[1]
    heads = MedusaHeads(recipe.num_heads, hidden_size)
    if init is not None:
        heads.load_state_dict(initial_heads(Path(init), recipe.num_heads, hidden_size).state_dict())
    opt = torch.optim.AdamW(heads.parameters(), lr=recipe.lr, weight_decay=recipe.weight_decay)
    positions = positions_with_offsets(train, recipe.num_heads)  # t with labels t+1 .. t+K in-sequence
    offsets = torch.arange(1, recipe.num_heads + 1)  # [K]
    weights = torch.tensor([recipe.head_decay ** i for i in range(recipe.num_heads)])  # [K]
    losses: list[float] = []
    held_pos = skip_prompt_start(heldout, positions_with_offsets(heldout, recipe.num_heads))
    held_pos = held_pos[torch.randperm(len(held_pos), generator=gen)[:512]]
    keeper = BestKeeper(heads)
    bar = budget.progress("train medusa")
    for step in bar:
        if step % recipe.eval_every == 0:
            keeper.offer(heldout_score(heads, heldout, held_pos, vocab_ids, head_weight, weights), step)
        for group in opt.param_groups:
            group["lr"] = learning_rate(recipe, step, bar.fraction)
        t = positions[torch.randint(len(positions), (recipe.batch_size,), generator=gen)]  # [B]
        labels = to_reduced(train.next_ids[t[:, None] + offsets], vocab_ids, full_vocab)  # [B, K]
        logits = head_logits(heads, train.features[t].float(), head_weight)  # [B, K, V']
        ce = torch.nn.functional.cross_entropy(logits.transpose(1, 2), labels, reduction="none",
                                               ignore_index=-100)  # [B, K]
        valid = (labels != -100).float()
        loss = ((ce * valid).sum(0) / valid.sum(0).clamp(min=1) * weights).sum()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if step % 10 == 0:
            bar.show(losses[-1])
    keeper.offer(heldout_score(heads, heldout, held_pos, vocab_ids, head_weight, weights), bar.steps)
    keeper.restore()
    paths, path_probs, top1 = choose_tree(heads, heldout, vocab_ids, head_weight, recipe)
    config = MedusaConfig(recipe.num_heads, hidden_size, full_vocab, tuple(paths))
    save_medusa(out, heads, vocab_ids, config)
    save_loss_curve(losses, out / "loss.png", "Medusa heads: weighted cross-entropy")
    summary = {"steps": bar.steps, "best_step": keeper.best_step, "train_s": round(bar.elapsed_s, 1), "final_loss": sum(losses[-50:]) / max(len(losses[-50:]), 1),
               "heldout_top1_per_head": top1, "expected_accepted_per_step": sum(path_probs),
               "tree_path_probs": [round(p, 4) for p in path_probs]}
    write_recipe(out, {"recipe": "medusa", "config": asdict(recipe), "budget": asdict(budget),
                       "num_train_tokens": len(train.ids), **(extra or {}), "result": summary})
    return summary


def initial_heads(path: Path, num_heads: int, hidden_size: int) -> MedusaHeads:
    """The float32 heads of the checkpoint at `path`, refused unless they have this recipe's shape."""
    heads, _, config = load_medusa(path, torch.float32)
    if (config.num_heads, config.hidden_size) != (num_heads, hidden_size):
        raise InvalidArgument(f"--init {str(path)!r}: {config.num_heads} heads of width {config.hidden_size}, "
                              f"the recipe trains {num_heads} of width {hidden_size}")
    return heads.requires_grad_(True)


@torch.no_grad()
def heldout_score(heads: MedusaHeads, fs: FeatureSet, positions: torch.Tensor, vocab_ids: torch.Tensor,
                  head_weight: torch.Tensor, weights: torch.Tensor) -> float:
    """Weighted top-1 accuracy of the heads on held-out positions (higher is better)."""
    k = len(weights)
    top = vocab_ids[head_logits(heads, fs.features[positions].float(), head_weight).argmax(-1)]  # [n, K]
    labels = fs.next_ids[positions[:, None] + torch.arange(1, k + 1)]  # [n, K]
    return float(((top == labels).float().mean(0) * weights).sum())


@torch.no_grad()
def choose_tree(heads: MedusaHeads, heldout: FeatureSet, vocab_ids: torch.Tensor, head_weight: torch.Tensor,
                recipe: MedusaRecipe) -> tuple[list[tuple[int, ...]], list[float], list[float]]:
    """(paths best first, their measured P(path right), held-out top-1 accuracy per head)."""
    k = recipe.num_heads
    positions = skip_prompt_start(heldout, positions_with_offsets(heldout, k))
    counts: Counter = Counter()
    hits = torch.zeros(k)
    for chunk in positions.split(512):
        logits = head_logits(heads, heldout.features[chunk].float(), head_weight)  # [n, K, V']
        top = vocab_ids[torch.topk(logits, recipe.max_rank, dim=-1).indices]  # [n, K, R] token ids
        labels = heldout.next_ids[chunk[:, None] + torch.arange(1, k + 1)]  # [n, K]
        match = top == labels[..., None]  # [n, K, R]
        rank = torch.where(match.any(-1), match.float().argmax(-1), torch.full_like(labels, -1))  # [n, K]
        hits += (rank == 0).float().sum(0)
        for row in rank.tolist():
            prefix: tuple[int, ...] = ()
            for r in row:
                if r < 0:
                    break
                prefix = prefix + (r,)
                counts[prefix] += 1
    total = max(len(positions), 1)
    chosen: list[tuple[int, ...]] = []
    probs: list[float] = []
    for path, count in sorted(counts.items(), key=lambda item: (-item[1], len(item[0]), item[0])):
        if len(chosen) >= recipe.num_tree_nodes:
            break
        if len(path) == 1 or path[:-1] in chosen:
            chosen.append(path)
            probs.append(count / total)
    if not chosen:
        chosen, probs = [(0,)], [0.0]
    # Node budget: the prefix maximising expected tokens per step over relative verify cost.
    gains = [(1 + sum(probs[:n])) / (1 + recipe.verify_cost_per_node * n) for n in range(1, len(chosen) + 1)]
    best = max(range(len(gains)), key=gains.__getitem__) + 1
    return chosen[:best], probs[:best], [round(float(h) / total, 4) for h in hits]
