"""Distilled draft model recipe: a small Llama sharing SmolLM2's tokenizer, trained on the target's distributions.

Loss: KL(target || draft) on every position of the cached sequences, both restricted to a reduced
vocabulary (FR-Spec: the most frequent target tokens), the target's logits recomputed from its cached
features through its own LM head. The input/output embedding is tied and initialised with the
top principal directions of the target's embedding matrix, so every token (including those outside
the reduced vocabulary) starts with a meaningful vector. The result is a plain Hugging Face
checkpoint: the existing draft-model drafter loads it unchanged.

A run can continue a checkpoint on new text (`init`: its weights and its reduced vocabulary, a fresh
optimizer), with the learning rate decayed over the sitting (`lr_schedule="cosine"`).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from specdec.errors import InvalidArgument
from specdec.models.runner import DRAFT_VOCAB_FILE, load_vocab_ids
from specdec.training.common import BestKeeper, Budget, learning_rate, prepare, save_loss_curve, write_recipe
from specdec.training.eagle import sample_windows
from specdec.training.features import FeatureSet


@dataclass(frozen=True)
class DraftRecipe:
    hidden_size: int = 256
    num_layers: int = 2
    num_heads: int = 4
    num_kv_heads: int = 2
    intermediate_size: int = 768
    vocab_size: int = 8192  # reduced vocabulary of the distillation loss
    window_len: int = 128
    batch_size: int = 12
    lr: float = 2e-3
    warmup_steps: int = 1  # none: the first (shipped) draft trained at lr from its first step
    # "constant": lr throughout (the first draft); "cosine": down to lr * min_lr_ratio over the budget (a sitting
    # that ends a run, e.g. one continued from a checkpoint: the last gains come once the step size shrinks)
    lr_schedule: str = "constant"
    min_lr_ratio: float = 0.05
    temperature: float = 1.0  # of the teacher's distribution
    num_heldout_seqs: int = 12
    eval_every: int = 25  # steps between held-out checks (early stopping)
    seed: int = 0


def make_draft(target_model, recipe: DraftRecipe):
    """A LlamaForCausalLM with the target's vocabulary and special tokens; embedding = PCA of the target's."""
    from transformers import LlamaConfig, LlamaForCausalLM

    tc = target_model.config
    config = LlamaConfig(vocab_size=tc.vocab_size, hidden_size=recipe.hidden_size,
                         intermediate_size=recipe.intermediate_size, num_hidden_layers=recipe.num_layers,
                         num_attention_heads=recipe.num_heads, num_key_value_heads=recipe.num_kv_heads,
                         max_position_embeddings=tc.max_position_embeddings, rms_norm_eps=tc.rms_norm_eps,
                         rope_parameters=getattr(tc, "rope_parameters", None), tie_word_embeddings=True,
                         bos_token_id=tc.bos_token_id, eos_token_id=tc.eos_token_id, pad_token_id=tc.pad_token_id)
    torch.manual_seed(recipe.seed)
    draft = LlamaForCausalLM(config)
    emb = target_model.get_input_embeddings().weight.detach().float()  # [vocab, H_target]
    q = min(recipe.hidden_size, emb.shape[1])
    _, _, v = torch.pca_lowrank(emb, q=q, center=False, niter=3)  # v: [H_target, q]
    projected = emb @ v  # [vocab, q]
    if q < recipe.hidden_size:  # a draft wider than the target: the extra directions start small and random
        projected = torch.cat([projected, 0.01 * projected.std() * torch.randn(len(emb), recipe.hidden_size - q)], 1)
    with torch.no_grad():
        draft.get_input_embeddings().weight.copy_(projected / projected.std() * 0.02 * 10)
    draft.tie_weights()
    draft.generation_config.eos_token_id = target_model.generation_config.eos_token_id
    return draft


def initial_draft(path: Path, target_model, recipe: DraftRecipe):
    """(float32 draft, its reduced vocabulary) of the checkpoint at `path`, refused unless it has this recipe's
    shape and the target's vocabulary. The vocabulary is kept, not chosen afresh: its head rows were trained."""
    from transformers import AutoConfig, LlamaForCausalLM

    path = Path(path)
    if not (path / "config.json").is_file() or not (path / DRAFT_VOCAB_FILE).is_file():
        raise InvalidArgument(f"--init {str(path)!r}: not a draft-model checkpoint (no config.json and {DRAFT_VOCAB_FILE})")
    config = AutoConfig.from_pretrained(path, local_files_only=True)
    have = (getattr(config, "hidden_size", None), getattr(config, "num_hidden_layers", None),
            getattr(config, "vocab_size", None))
    want = (recipe.hidden_size, recipe.num_layers, target_model.config.vocab_size)
    if have != want:
        raise InvalidArgument(f"--init {str(path)!r}: hidden {have[0]}, {have[1]} layers, vocabulary {have[2]}; "
                              f"the recipe trains hidden {want[0]}, {want[1]} layers, vocabulary {want[2]}")
    draft = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    return draft, load_vocab_ids(path)


def train_draft(fs: FeatureSet, target, recipe: DraftRecipe, budget: Budget, out: Path,
                extra: dict | None = None, init: Path | None = None) -> dict:
    """target: the LoadedModel (its tokenizer is saved beside the draft). init: a draft checkpoint to continue
    (its weights and reduced vocabulary; fresh optimizer) instead of a new draft."""
    gen, train, heldout, vocab_ids = prepare(fs, recipe)
    if init is not None:
        draft, vocab_ids = initial_draft(Path(init), target.model, recipe)
    else:
        draft = make_draft(target.model, recipe)
    draft = draft.float().train()
    teacher_head = target.model.get_output_embeddings().weight.detach().float()[vocab_ids]  # [V', H_target]
    decoder = draft.model
    opt = torch.optim.AdamW(draft.parameters(), lr=recipe.lr, weight_decay=0.0)
    losses: list[float] = []
    held = [sample_windows(heldout, 8, recipe.window_len, gen) for _ in range(2)]  # fixed held-out windows
    keeper = BestKeeper(draft)
    scores: list[float] = []  # held-out agreement at each check; the first is the starting weights'

    def heldout_agreement() -> float:
        with torch.no_grad():
            held_logp = teacher_log_probs(heldout, teacher_head, recipe.temperature)
            hits = [distill_loss(decoder, draft, b, vocab_ids, held_logp)[1][b[4][b[5]] + 1 >= 32] for b in held]
        return float(torch.cat(hits).mean())

    train_logp = teacher_log_probs(train, teacher_head, recipe.temperature)
    bar = budget.progress("train draft")
    for step in bar:
        if step % recipe.eval_every == 0:
            scores.append(heldout_agreement())
            keeper.offer(scores[-1], step)
        for group in opt.param_groups:
            group["lr"] = learning_rate(recipe, step, bar.fraction)
        batch = sample_windows(train, recipe.batch_size, recipe.window_len, gen)
        loss, _ = distill_loss(decoder, draft, batch, vocab_ids, train_logp)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
        opt.step()
        losses.append(loss.item())
        if step % 5 == 0:
            bar.show(losses[-1])
        if step % 100 == 0:  # a line the log keeps (the bar redraws in place)
            print(f"step {step}: loss {losses[-1]:.4f}, lr {opt.param_groups[0]['lr']:.2e}, "
                  f"held-out top-1 best {keeper.best_score:.4f} (step {keeper.best_step}), "
                  f"{bar.elapsed_s / 60:.1f} min", flush=True)
    scores.append(heldout_agreement())
    keeper.offer(scores[-1], bar.steps)
    keeper.restore()
    draft.eval()
    out.mkdir(parents=True, exist_ok=True)
    draft.to(torch.bfloat16).save_pretrained(out)
    if target.tokenizer is not None:
        target.tokenizer.save_pretrained(out)
    (out / DRAFT_VOCAB_FILE).write_text(json.dumps(vocab_ids.tolist()))  # the head computes only these rows
    save_loss_curve(losses, out / "loss.png", "draft model: KL(target || draft), reduced vocabulary")
    summary = {"steps": bar.steps, "train_s": round(bar.elapsed_s, 1),
               "final_loss": sum(losses[-20:]) / max(len(losses[-20:]), 1),
               "first_loss": losses[0] if losses else None,
               "best_step": keeper.best_step, "heldout_top1_agreement": round(keeper.best_score, 4),
               # the weights it started from (a fresh draft or --init's), on the same held-out windows
               "start_heldout_top1_agreement": round(scores[0], 4),
               "num_params": sum(p.numel() for p in draft.parameters())}
    write_recipe(out, {"recipe": "draft", "config": asdict(recipe), "budget": asdict(budget),
                       "num_train_tokens": len(train.ids), **(extra or {}), "result": summary})
    return summary


def teacher_log_probs(fs: FeatureSet, head: torch.Tensor, temperature: float):
    """rows [n] -> the target's log-probabilities over the reduced vocabulary there [n, V'] float32,
    computed per batch from the cached features (a table for every position would take tokens x V' x
    2 bytes: ~10 GB at 600k tokens). head: [V', H_target]."""
    @torch.no_grad()
    def at(rows: torch.Tensor) -> torch.Tensor:
        return F.log_softmax(fs.features[rows].float() @ head.T / temperature, dim=-1)
    return at


def distill_loss(decoder, draft, batch, vocab_ids: torch.Tensor,
                 teacher_logp) -> tuple[torch.Tensor, torch.Tensor]:
    """(KL over the reduced vocabulary, top-1 agreement per valid position) on a batch of sample_windows.

    Window pair j reads tokens up to x_{t+1} and must match the target's distribution there, which
    is the LM head applied to the cached feature f_{t+1}; teacher_logp(rows) gives it ([n, V'])."""
    _, toks, _, _, positions, valid, index = batch
    mask = valid.long()
    hidden = decoder(input_ids=toks, attention_mask=mask, position_ids=positions + 1).last_hidden_state  # [B, L-1, h]
    student = hidden[valid] @ draft.get_output_embeddings().weight[vocab_ids].T  # [n, V']
    teacher = teacher_logp(index[valid])  # [n, V']
    loss = F.kl_div(F.log_softmax(student, dim=-1), teacher, log_target=True, reduction="batchmean")
    return loss, (student.argmax(-1) == teacher.argmax(-1)).float()
