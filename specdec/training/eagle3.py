"""EAGLE-3-style recipe: fused low/middle/high target features, one decoder layer, the training-time test.

Trains on the fused-feature cache (specdec.training.fused: the target's own greedy answers) with
specdec.training.ttt's unrolled loss. Resumable: every `save_every_s` and at the end the head, the
optimizer, the step count and the data position (epoch, next window of that epoch's seeded
shuffle) go to out/train_state.pt; `resume` continues from there, so a long run can be done in
several sittings on a small machine (the data position indexes the windows of the shards given to that
sitting: adding shards between sittings reshuffles, it does not repeat an epoch). recipe.json records the recipe, the data size in tokens and
the training minutes summed over the sittings.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec.drafters.eagle_layer import EagleConfig, EagleHead, save_eagle
from specdec.training.common import (Budget, command_line, learning_rate, reduced_vocab, save_loss_curve, to_reduced,
                                     write_recipe)
from specdec.training.features import FeatureSet
from specdec.training.ttt import ttt_losses

STATE_FILE = "train_state.pt"  # beside the weights; not shipped (optimizer moments are twice the head's size)


@dataclass(frozen=True)
class Eagle3Recipe:
    vocab_size: int = 8192  # reduced draft vocabulary: the most frequent target-greedy tokens
    window_len: int = 128  # pairs per training window
    batch_size: int = 8  # windows per step
    ttt_steps: int = 3  # unrolled drafting depths per window (the training-time test); each costs a full step
    lr: float = 8e-4
    warmup_steps: int = 30  # counted from the first sitting's first step: a resumed sitting does not warm up again
    # "constant": lr after warm-up (sittings that more will follow); "cosine": from lr down to lr * min_lr_ratio over
    # this sitting's budget (a sitting meant to end the run: the loss falls further once the step size shrinks)
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.05
    num_heldout_seqs: int = 16
    eval_every: int = 50
    save_every_s: float = 300.0
    # bf16 autocast: ~1.5x faster steps on a CPU with avx512_bf16 (measured 6 vs 9 s for 8 x 128 pairs, 4 TTT
    # steps, SmolLM2-135M dims); the weights and the optimizer stay float32
    bf16_autocast: bool = True
    top_k: int = 8
    depth: int = 6
    num_nodes: int = 24
    seed: int = 0


def init_head(config: EagleConfig, model) -> EagleHead:
    """The layer starts as a copy of the target layer that follows the highest fused one, fc as [I | I]
    (feature + embedding), fuse as picking that highest layer, norm as the target's final norm."""
    head = EagleHead(config)
    decoder = getattr(model, model.base_model_prefix)
    layer = decoder.layers[min(config.feature_layers[-1], len(decoder.layers) - 1)]
    pairs = {"input_norm": layer.input_layernorm, "post_norm": layer.post_attention_layernorm,
             "q_proj": layer.self_attn.q_proj, "k_proj": layer.self_attn.k_proj, "v_proj": layer.self_attn.v_proj,
             "o_proj": layer.self_attn.o_proj, "gate_proj": layer.mlp.gate_proj, "up_proj": layer.mlp.up_proj,
             "down_proj": layer.mlp.down_proj, "norm": decoder.norm}
    h = config.hidden_size
    with torch.no_grad():
        for name, source in pairs.items():
            getattr(head, name).weight.copy_(source.weight.float())
        head.fc.weight.copy_(torch.cat([torch.eye(h), torch.eye(h)], dim=1))
        head.fc.bias.zero_()
        head.fuse.weight.zero_()
        head.fuse.weight[:, -h:] = torch.eye(h)
    return head


def windows_of(fs: FeatureSet, length: int) -> torch.Tensor:
    """[num_windows, 2] (start, end) flat offsets: every sequence cut into consecutive windows of `length`
    pairs + 1 token (one epoch sees each position once)."""
    spans = []
    for a, b in zip(fs.cu_seqlens[:-1].tolist(), fs.cu_seqlens[1:].tolist()):
        for s in range(a, b - 2, length):
            spans.append((s, min(s + length + 1, b)))
    return torch.tensor(spans, dtype=torch.long)


def make_batch(fs: FeatureSet, spans: torch.Tensor, vocab_ids: torch.Tensor, embed: torch.Tensor, length: int):
    """(feats [B, n, F], embeds [B, n, H], reduced labels [B, n], valid [B, n]) for windows `spans`."""
    num, width = len(spans), fs.features.shape[1]
    feats = torch.zeros(num, length, width)
    toks = torch.zeros(num, length, dtype=torch.long)
    labels = torch.full((num, length), -100, dtype=torch.long)
    valid = torch.zeros(num, length, dtype=torch.bool)
    for row, (a, b) in enumerate(spans.tolist()):
        n = b - a - 1
        feats[row, :n] = fs.features[a:b - 1].float()
        toks[row, :n] = fs.ids[a + 1:b]
        labels[row, :n] = to_reduced(fs.next_ids[a + 1:b], vocab_ids, embed.shape[0])
        valid[row, :n] = True
    return feats, embed[toks], labels, valid


def train_eagle3(fs: FeatureSet, model, recipe: Eagle3Recipe, budget: Budget, out: Path, resume: bool = False,
                 extra: dict | None = None, feature_layers: tuple[int, ...] = ()) -> dict:
    out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(recipe.seed)
    embed = model.get_input_embeddings().weight.detach().float()  # [vocab, H]
    state = torch.load(out / STATE_FILE, weights_only=False) if resume and (out / STATE_FILE).is_file() else None
    if resume and state is None:
        print(f"no {out / STATE_FILE} to resume from: starting afresh")
    # a resumed sitting keeps the first sitting's held-out sequences (shards added later come after the old ones,
    # so their indices hold): re-picking by stride over more shards would hold out text already trained on
    held_seqs = state.get("heldout_seqs") if state else None
    if not held_seqs or max(held_seqs) >= fs.num_seqs:
        held_seqs = fs.heldout_seqs(min(recipe.num_heldout_seqs, max(fs.num_seqs // 5, 1)))
    train, heldout = fs.split(0, held_seqs)
    vocab_ids = state["vocab_ids"] if state else reduced_vocab(train, recipe.vocab_size)
    head_weight = model.get_output_embeddings().weight.detach().float()[vocab_ids]  # [V', H] frozen
    config = EagleConfig.for_target(model.config, top_k=recipe.top_k, depth=recipe.depth, num_nodes=recipe.num_nodes,
                                    feature_layers=tuple(feature_layers))
    head = init_head(config, model)
    opt = torch.optim.AdamW(head.parameters(), lr=recipe.lr, weight_decay=0.0)
    progress = {"step": 0, "epoch": 0, "position": 0, "train_s": 0.0, "losses": [], "heldout": [], "sittings": 0}
    if state:
        head.load_state_dict(state["head"])
        opt.load_state_dict(state["optimizer"])
        progress = state["progress"]
    spans = windows_of(train, recipe.window_len)
    held = make_batch(heldout, windows_of(heldout, recipe.window_len)[:16], vocab_ids, embed, recipe.window_len)
    progress["sittings"] += 1
    start_step, start_s, last_save = progress["step"], progress["train_s"], time.perf_counter()

    def save_state() -> None:
        torch.save({"head": head.state_dict(), "optimizer": opt.state_dict(), "vocab_ids": vocab_ids,
                    "heldout_seqs": held_seqs, "progress": progress, "recipe": asdict(recipe)}, out / STATE_FILE)

    bar = budget.progress("train eagle3 (ttt)")
    for _ in bar:
        order = torch.randperm(len(spans), generator=torch.Generator().manual_seed(recipe.seed + progress["epoch"]))
        pick = order[progress["position"]:progress["position"] + recipe.batch_size]
        progress["position"] += recipe.batch_size
        if progress["position"] >= len(spans):
            progress["epoch"], progress["position"] = progress["epoch"] + 1, 0
        for group in opt.param_groups:
            group["lr"] = learning_rate(recipe, progress["step"], bar.fraction)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16_autocast):
            loss, _ = ttt_losses(head, *make_batch(train, spans[pick], vocab_ids, embed, recipe.window_len),
                                 head_weight, recipe.ttt_steps)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        progress["step"] += 1
        progress["losses"].append(loss.item())
        progress["train_s"] = start_s + bar.elapsed_s
        bar.show(progress["losses"][-1])
        if progress["step"] % recipe.eval_every == 0:
            progress["heldout"].append((progress["step"], heldout_accuracy(head, held, head_weight, recipe)))
        if time.perf_counter() - last_save > recipe.save_every_s:
            save_state()
            last_save = time.perf_counter()
    accuracy = heldout_accuracy(head, held, head_weight, recipe)
    # one entry per sitting (states of older runs lack it: their sittings are summed in the totals only)
    progress.setdefault("history", []).append({
        "sitting": progress["sittings"], "command": command_line(), "steps": progress["step"] - start_step,
        "minutes": round((progress["train_s"] - start_s) / 60, 1), "lr_schedule": recipe.lr_schedule,
        "peak_lr": recipe.lr,
        "num_train_tokens": len(train.ids), "heldout_top1_by_depth": [round(a, 4) for a in accuracy]})
    save_state()
    head.eval()
    save_eagle(out, head, vocab_ids)
    save_loss_curve(progress["losses"], out / "loss.png", f"EAGLE-3 head: CE over {recipe.ttt_steps} TTT steps")
    summary = {"steps": progress["step"], "steps_this_sitting": progress["step"] - start_step,
               "sittings": progress["sittings"],
               "epochs": round(progress["epoch"] + progress["position"] / len(spans), 3),
               "train_minutes": round(progress["train_s"] / 60, 1),
               "final_loss": sum(progress["losses"][-20:]) / max(len(progress["losses"][-20:]), 1),
               "heldout_top1_by_depth": [round(a, 4) for a in accuracy], "sitting_history": progress["history"]}
    write_recipe(out, {"recipe": "eagle3", "config": asdict(recipe), "feature_layers": list(feature_layers),
                       "num_train_tokens": len(train.ids), "num_heldout_tokens": len(heldout.ids),
                       **(extra or {}), "result": summary})
    return summary


@torch.no_grad()
def heldout_accuracy(head: EagleHead, batch, head_weight: torch.Tensor, recipe: Eagle3Recipe) -> list[float]:
    """Top-1 next-token accuracy per unrolled depth on fixed held-out windows (depth d reads its own d - 1 outputs)."""
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=recipe.bf16_autocast):
        return ttt_losses(head, *batch, head_weight, recipe.ttt_steps)[1]
