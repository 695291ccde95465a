"""The fused-feature cache of the EAGLE-3-style head: low, middle and high layer states of the target's own answers.

Self-distillation: the target answers chat prompts greedily (batched: per token, far cheaper than one
at a time on a CPU), and generation itself records, at every position, the hidden states after the
chosen layers (no second pass). Each shard is cached on its own (cache_root/fused/<key>/), so a
long data run can stop at any shard and resume; the trainer reads whichever shards exist. Per shard:
    ids[t]        token at t                                                     [N] int32
    features[t]   cat(hidden after layer l for l in layers) at t                 [N, len(layers) * H] bfloat16
                  (bf16, not float16: the residual stream reaches 25k)
    next_ids[t]   the target's greedy next token given ids[:t+1]                 [N] int32
    cu_seqlens    sequence offsets                                               [num_seqs + 1] int64
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from specdec.training.features import FeatureSet, generation_model, greedy_batches, load_features, save_features


def default_layers(num_layers: int) -> tuple[int, int, int]:
    """EAGLE-3's choice: after layer 2, the middle one and the third from the end (hidden_states indices:
    k = after k decoder layers, before the final norm, so k < num_layers); tiny test models: 1, middle, last but one."""
    if num_layers >= 8:
        return (2, num_layers // 2, num_layers - 3)
    return (1, max(num_layers // 2, 1), max(num_layers - 1, 1))


@dataclass(frozen=True)
class FusedShard:
    seed: int
    num_prompts: int = 256
    max_new_tokens: int = 128
    num_passages: int = 24
    source: str = "stdlib"  # where documentation passages come from: stdlib | packages (specdec.training.prompts)
    layers: tuple[int, ...] = ()  # () = default_layers of the target
    max_seq_len: int = 448
    batch_size: int = 64
    # the target's forwards in bfloat16 (a bf16 copy of its weights; the first shards of the shipped run used
    # bf16 autocast): 3-4x faster on a CPU with avx512_bf16 (measured: a 32 x 100 prefill in 13 s vs 52 s on a
    # shared 2-core machine); answers, features and labels then carry bf16 rounding (a little like EAGLE's
    # input noise) and may part from the float32 target's greedy text after a while
    bf16: bool = True

    def key(self, target_path: str) -> str:
        blob = json.dumps({"target": str(target_path), **asdict(self)}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


def _fused(hidden_states: tuple, layers: tuple[int, ...]) -> torch.Tensor:
    return torch.cat([hidden_states[k] for k in layers], dim=-1)


@torch.inference_mode()
def generate_fused(model, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int, eos_id: int | None,
                   pad_id: int, layers: tuple[int, ...]) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """(ids, fused features [len, F] bf16, next_ids [len]) of prompt + the target's greedy answer
    (specdec.training.features.greedy_batches); ids = (prompt + answer)[:-1]."""
    head = model.get_output_embeddings().weight  # [vocab, H]
    h = head.shape[1]
    # the fused layers, and the last one (after the final norm) to read the target's next token in the prompt
    pick = lambda states: torch.cat([_fused(states, layers), states[-1]], dim=-1)  # noqa: E731  [batch, n, F + H]
    out: dict[int, tuple[list[int], torch.Tensor, torch.Tensor]] = {}
    for rows, answers, prompt_f, step_f in greedy_batches(model, prompt_ids, max_new_tokens, batch_size, eos_id,
                                                          pad_id, pick):
        for row, (i, answer) in enumerate(zip(rows, answers)):
            feats = torch.cat([prompt_f[row][:, :-h], step_f[row, :len(answer) - 1, :-h]]).to(torch.bfloat16)
            prompt_next = (prompt_f[row][:, -h:] @ head.T).argmax(-1)  # [len(prompt)]
            next_ids = torch.cat([prompt_next, torch.tensor(answer[1:], dtype=torch.long)])
            out[i] = ((list(prompt_ids[i]) + answer)[:-1], feats, next_ids)
    return [out[i] for i in range(len(prompt_ids))]


@torch.inference_mode()
def read_fused(model, sequences: list[list[int]], layers: tuple[int, ...], batch_size: int = 8
               ) -> list[tuple[list[int], torch.Tensor, torch.Tensor]]:
    """Teacher-forced passages: one right-padded forward per batch -> (ids, features fp16, next_ids)."""
    head = model.get_output_embeddings().weight
    out = []
    for start in range(0, len(sequences), batch_size):
        batch = sequences[start:start + batch_size]
        width = max(len(s) for s in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, s in enumerate(batch):
            ids[row, :len(s)] = torch.tensor(s)
            mask[row, :len(s)] = 1
        hs = model(input_ids=ids, attention_mask=mask, output_hidden_states=True).hidden_states
        fused = _fused(hs, layers)
        for row, s in enumerate(batch):
            labels = (hs[-1][row, :len(s)] @ head.T).argmax(-1)
            out.append((list(s), fused[row, :len(s)].to(torch.bfloat16), labels))
    return out


def pack(pieces: list[tuple[list[int], torch.Tensor, torch.Tensor]]) -> FeatureSet:
    lens = torch.tensor([0] + [len(s) for s, _, _ in pieces], dtype=torch.long)
    return FeatureSet(torch.tensor([t for s, _, _ in pieces for t in s], dtype=torch.long),
                      torch.cat([f for _, f, _ in pieces]), torch.cat([n for _, _, n in pieces]).long(),
                      lens.cumsum(0))


def shard_dir(target, shard: FusedShard, cache_root: Path) -> Path:
    return Path(cache_root) / "fused" / shard.key(str(target.path))


def build_shard(target, shard: FusedShard, cache_root: Path, prompt_ids: list[list[int]] | None = None) -> FeatureSet:
    """The shard's FeatureSet, generated on first use and cached. prompt_ids: already-encoded prompts
    (tests); None = chat prompts and passages of specdec.training.prompts for shard.seed / shard.source."""
    directory = shard_dir(target, shard, cache_root)
    if (directory / "features.safetensors").is_file():
        return load_features(directory)
    torch.manual_seed(shard.seed)
    model, tok = target.model, target.tokenizer
    layers = shard.layers or default_layers(model.config.num_hidden_layers)
    passages: list[list[int]] = []
    if prompt_ids is None:
        from specdec.training.prompts import chat_prompts, stdlib_passages

        prompt_ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False)[-320:]
                      for p in chat_prompts(shard.seed, shard.num_prompts, shard.source)]
        passages = [tok.encode(p)[:256] for p in stdlib_passages(shard.num_passages, shard.seed, shard.source)]
    eos_id = model.generation_config.eos_token_id
    eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
    model = generation_model(model, shard.bf16)
    answers = generate_fused(model, prompt_ids, shard.max_new_tokens, shard.batch_size, eos_id,
                             eos_id if eos_id is not None else 0, layers)
    pieces = [(i[:shard.max_seq_len], f[:shard.max_seq_len], n[:shard.max_seq_len]) for i, f, n in answers
              if len(i) >= 2]
    pieces += read_fused(model, [p for p in passages if len(p) >= 2], layers)
    fs = pack(pieces)
    save_features(fs, directory, {"target": str(target.path), "shard": asdict(shard), "layers": list(layers),
                                  "num_tokens": len(fs.ids), "num_seqs": fs.num_seqs})
    return fs


def cached_shards(target, shards: list[FusedShard], cache_root: Path) -> list[FusedShard]:
    """The shards already on disk (the trainer can start before a long data run has finished)."""
    return [s for s in shards if (shard_dir(target, s, cache_root) / "features.safetensors").is_file()]
