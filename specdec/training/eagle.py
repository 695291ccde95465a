"""EAGLE-style recipe: one decoder layer learns to predict the target's next feature from cached features.

Pair t = (f_t, embed(x_{t+1})) -> predicted f_{t+1}; loss = SmoothL1(predicted, f_{t+1}) plus
ce_weight x cross-entropy of the target's LM head (reduced vocabulary) on the predicted feature
against next_ids[t+1] (the target's greedy token). Inputs get uniform noise (EAGLE's remedy for
drafting from its own, imperfect, features at depth > 1). The layer starts as a copy of the target's
last decoder layer and fc as [I | I]: a working attention block to fine-tune, not a random one.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.drafters.eagle_layer import EagleConfig, EagleHead, save_eagle
from specdec.training.common import BestKeeper, Budget, prepare, save_loss_curve, to_reduced, write_recipe
from specdec.training.features import FeatureSet


@dataclass(frozen=True)
class EagleRecipe:
    vocab_size: int = 8192
    window_len: int = 128  # tokens per training window
    batch_size: int = 8  # windows per step
    lr: float = 5e-4
    ce_weight: float = 0.5
    noise: float = 0.1  # uniform input noise, as a fraction of the features' RMS
    init_from_target: bool = True
    top_k: int = 8
    depth: int = 6
    num_nodes: int = 24  # verify budget: on this CPU every extra node costs ~2% of a target forward
    num_heldout_seqs: int = 12
    eval_every: int = 25  # steps between held-out checks (early stopping)
    seed: int = 0


def init_from_target(head: EagleHead, model) -> None:
    """Copy the target's last decoder layer into the head; fc = [I | I] (feature + embedding)."""
    layer = getattr(model, model.base_model_prefix).layers[-1]
    pairs = {"input_norm": layer.input_layernorm, "post_norm": layer.post_attention_layernorm,
             "q_proj": layer.self_attn.q_proj, "k_proj": layer.self_attn.k_proj, "v_proj": layer.self_attn.v_proj,
             "o_proj": layer.self_attn.o_proj, "gate_proj": layer.mlp.gate_proj, "up_proj": layer.mlp.up_proj,
             "down_proj": layer.mlp.down_proj}
    with torch.no_grad():
        for name, source in pairs.items():
            getattr(head, name).weight.copy_(source.weight.float())
        h = head.c.hidden_size
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.eye(h)], dim=1))
        head.fc.bias.zero_()


def sample_windows(fs: FeatureSet, num: int, length: int, gen: torch.Generator):
    """Random windows: (feats [B, L-1, H], next tokens [B, L-1], target feats [B, L-1, H], labels [B, L-1],
    positions [B, L-1], valid [B, L-1], flat index of the target position [B, L-1]); right-padded,
    `valid` marks real pairs."""
    seqs = torch.randint(fs.num_seqs, (num,), generator=gen).tolist()
    hidden = fs.features.shape[1]
    feats = torch.zeros(num, length - 1, hidden)
    tgt = torch.zeros(num, length - 1, hidden)
    toks = torch.zeros(num, length - 1, dtype=torch.long)
    labels = torch.full((num, length - 1), -1, dtype=torch.long)
    positions = torch.zeros(num, length - 1, dtype=torch.long)
    valid = torch.zeros(num, length - 1, dtype=torch.bool)
    index = torch.zeros(num, length - 1, dtype=torch.long)
    for row, s in enumerate(seqs):
        a, b = int(fs.cu_seqlens[s]), int(fs.cu_seqlens[s + 1])
        start = a + int(torch.randint(max(b - a - length, 0) + 1, (1,), generator=gen))
        end = min(start + length, b)
        n = end - start - 1  # pairs in this window
        if n <= 0:
            continue
        feats[row, :n] = fs.features[start:end - 1].float()
        tgt[row, :n] = fs.features[start + 1:end].float()
        toks[row, :n] = fs.ids[start + 1:end]
        labels[row, :n] = fs.next_ids[start + 1:end]
        positions[row, :n] = torch.arange(start - a, end - 1 - a)
        valid[row, :n] = True
        index[row, :n] = torch.arange(start + 1, end)
    return feats, toks, tgt, labels, positions, valid, index


def eagle_losses(head: EagleHead, batch, embed: torch.Tensor, head_weight: torch.Tensor, vocab_ids: torch.Tensor,
                 noise: float, gen: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(regression loss, cross-entropy, top-1 hits per valid pair) for one batch of windows."""
    feats, toks, tgt, labels, positions, valid, _ = batch
    if noise > 0:
        rms = feats.pow(2).mean().sqrt()
        feats = feats + (torch.rand(feats.shape, generator=gen) - 0.5) * 2 * noise * rms
    outs = []
    for row in range(feats.shape[0]):  # rows differ in positions; the layer takes one position vector
        out, _ = head(feats[row:row + 1], embed[toks[row]][None], positions[row])
        outs.append(out[0])
    out = torch.stack(outs)  # [B, L-1, H]
    reg = F.smooth_l1_loss(out[valid], tgt[valid])
    red = to_reduced(labels.clamp(min=0), vocab_ids, embed.shape[0])  # [B, L-1]
    red[~valid] = -100
    logits = out[valid] @ head_weight.T  # [num_valid, V']
    ce = F.cross_entropy(logits, red[valid], ignore_index=-100)
    hits = (logits.argmax(-1) == red[valid]).float()
    return reg, ce, hits


@torch.no_grad()
def heldout_top1(head: EagleHead, windows: list, embed: torch.Tensor, head_weight: torch.Tensor,
                 vocab_ids: torch.Tensor, skip: int = 32) -> float:
    """Top-1 next-token accuracy on fixed held-out windows, past each sequence's first `skip` positions."""
    hits = []
    for batch in windows:
        h = eagle_losses(head, batch, embed, head_weight, vocab_ids, 0.0, None)[2]  # [num_valid]
        hits.append(h[batch[4][batch[5]] >= skip])
    hits = torch.cat(hits)
    return float(hits.mean()) if len(hits) else 0.0


def train_eagle(fs: FeatureSet, model, recipe: EagleRecipe, budget: Budget, out: Path,
                extra: dict | None = None) -> dict:
    gen, train, heldout, vocab_ids = prepare(fs, recipe)
    embed = model.get_input_embeddings().weight.detach().float()  # [vocab, H]
    head_weight = model.get_output_embeddings().weight.detach().float()[vocab_ids]  # [V', H]
    config = EagleConfig.for_target(model.config, top_k=recipe.top_k, depth=recipe.depth, num_nodes=recipe.num_nodes)
    head = EagleHead(config)
    if recipe.init_from_target:
        init_from_target(head, model)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=0.0)
    losses: list[float] = []
    held = [sample_windows(heldout, 8, recipe.window_len, gen) for _ in range(2)]  # fixed held-out windows
    keeper = BestKeeper(head)
    bar = budget.progress("train eagle")
    for step in bar:
        if step % recipe.eval_every == 0:
            keeper.offer(heldout_top1(head, held, embed, head_weight, vocab_ids), step)
        batch = sample_windows(train, recipe.batch_size, recipe.window_len, gen)
        reg, ce, _ = eagle_losses(head, batch, embed, head_weight, vocab_ids, recipe.noise, gen)
        loss = reg + recipe.ce_weight * ce
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 5 == 0:
            bar.show(losses[-1])
    keeper.offer(heldout_top1(head, held, embed, head_weight, vocab_ids), bar.steps)
    keeper.restore()
    head.eval()
    save_eagle(out, head, vocab_ids)
    save_loss_curve(losses, out / "loss.png", "EAGLE head: SmoothL1 + ce_weight x CE")
    summary = {"steps": bar.steps, "best_step": keeper.best_step, "train_s": round(bar.elapsed_s, 1),
               "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1),
               "heldout_top1_next_token": round(keeper.best_score, 4)}
    write_recipe(out, {"recipe": "eagle", "config": asdict(recipe), "budget": asdict(budget),
                       "num_train_tokens": len(train.ids), **(extra or {}), "result": summary})
    return summary
