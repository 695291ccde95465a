"""The feature cache: token ids and the target's last hidden states, computed once, reused by every recipe.

On this CPU the target prefills only a few hundred tokens a second, so the expensive part of every
recipe (running the frozen target) happens once: the target answers the training prompts greedily
(self-distillation text), then one batched forward over prompt + answer (and raw stdlib passages)
records, per position t:
    ids[t]       the token at t                                   [num_tokens] int32
    features[t]  the target's last hidden state after the final norm at t (what the LM head reads)
                                                                  [num_tokens, hidden] float16
    next_ids[t]  argmax of the target's LM head at t: its greedy next token given ids[:t+1]
                                                                  [num_tokens] int32
    cu_seqlens   sequence boundaries (flat tensors plus cumulative offsets)  [num_seqs + 1] int64
Drafters are trained to predict next_ids (what greedy verification accepts), not the raw text.
"""
from __future__ import annotations

import copy
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import torch
from safetensors.torch import load_file, save_file
from tqdm import tqdm


@dataclass(frozen=True)
class FeatureCacheConfig:
    num_prompts: int = 128  # chat prompts the target answers (greedy) to make its own training text
    max_new_tokens: int = 128  # length of each target answer
    num_passages: int = 30  # raw stdlib docstring passages, teacher-forced
    max_seq_len: int = 448  # longer sequences are cut
    generate_batch_size: int = 64  # decode throughput on 2 cores: 186 tok/s at 32, 238 at 64, 233 at 96
    seed: int = 0
    # the target's forwards in a bf16 copy of its weights: 3-4x faster on a CPU with avx512_bf16 (as the fused
    # shards, specdec.training.fused); answers, features and labels then carry bf16 rounding
    bf16: bool = False

    def key(self, target_path: str) -> str:
        fields = asdict(self)
        if not self.bf16:  # float32 shards keep the keys they had before the field existed
            fields.pop("bf16")
        blob = json.dumps({"target": str(target_path), **fields}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]


@dataclass(frozen=True)
class FeatureSet:
    ids: torch.Tensor  # [num_tokens] int64
    features: torch.Tensor  # [num_tokens, hidden] float16
    next_ids: torch.Tensor  # [num_tokens] int64
    cu_seqlens: torch.Tensor  # [num_seqs + 1] int64

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    def select(self, seqs: list[int]) -> FeatureSet:
        """The sub-set made of the given sequences, in that order."""
        spans = [(int(self.cu_seqlens[s]), int(self.cu_seqlens[s + 1])) for s in seqs]
        rows = torch.cat([torch.arange(a, b) for a, b in spans]) if spans else torch.zeros(0, dtype=torch.long)
        lens = torch.tensor([0] + [b - a for a, b in spans], dtype=torch.long)
        return FeatureSet(self.ids[rows], self.features[rows], self.next_ids[rows], lens.cumsum(0))

    def heldout_seqs(self, num_heldout_seqs: int) -> list[int]:
        """Every (num_seqs // num_heldout_seqs)-th sequence, so the held-out set mixes every kind of text
        (answers to each task family and raw passages) like the training set."""
        stride = max(self.num_seqs // max(num_heldout_seqs, 1), 1)
        return [s for s in range(self.num_seqs) if s % stride == stride - 1][:num_heldout_seqs]

    def split(self, num_heldout_seqs: int, held: list[int] | None = None) -> tuple[FeatureSet, FeatureSet]:
        """(train, held-out): the sequences `held` (default: heldout_seqs) are held out."""
        held = self.heldout_seqs(num_heldout_seqs) if held is None else held
        keep = sorted(set(range(self.num_seqs)) - set(held))
        return self.select(keep), self.select(held)


@torch.inference_mode()
def greedy_batches(model, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int, eos_id: int | None,
                   pad_id: int, pick) -> Iterator[tuple[list[int], list[list[int]], torch.Tensor, torch.Tensor]]:
    """The target's greedy answers to prompt_ids, generated in left-padded batches of similar lengths, with
    what `pick` keeps of the hidden states generation itself recorded (no second pass).

    pick: one step's hidden_states (a tuple over layers of [batch, n, H]) -> [batch, n, F].
    Yields (indices into prompt_ids, answers cut after their first eos, each row's picked states at its
    own prompt positions [len(prompt), F] (padding dropped), the picked states of the answer steps
    [batch, steps - 1, F]). The last answer token's state is never computed.
    """
    order = sorted(range(len(prompt_ids)), key=lambda i: len(prompt_ids[i]))  # similar lengths: less padding
    for start in tqdm(range(0, len(order), batch_size), desc="target answers", unit="batch"):
        rows = order[start:start + batch_size]
        batch = [prompt_ids[i] for i in rows]
        width = max(len(p) for p in batch)
        ids = torch.full((len(batch), width), pad_id, dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, p in enumerate(batch):
            ids[row, width - len(p):] = torch.tensor(p)
            mask[row, width - len(p):] = 1
        gen = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=eos_id, pad_token_id=pad_id, return_dict_in_generate=True,
                             output_hidden_states=True)
        answers = []
        for answer in gen.sequences[:, width:].tolist():
            if eos_id is not None and eos_id in answer:
                answer = answer[:answer.index(eos_id) + 1]
            answers.append(answer)
        prompt_f = pick(gen.hidden_states[0])  # [batch, width, F]
        step_f = torch.cat([pick(h) for h in gen.hidden_states[1:]], dim=1) if len(gen.hidden_states) > 1 \
            else prompt_f[:, :0]  # [batch, steps - 1, F]
        del gen  # every layer's states: gone before the next batch generates
        yield rows, answers, [prompt_f[row, width - len(p):] for row, p in enumerate(batch)], step_f


def generate_answers(model, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int,
                     eos_id: int | None, pad_id: int) -> list[tuple[list[int], torch.Tensor]]:
    """(ids, features) of prompt + the target's greedy answer: ids = (prompt + answer)[:-1],
    features [len(ids), hidden] float32 (the last layer's output, after the final norm)."""
    out: dict[int, tuple[list[int], torch.Tensor]] = {}
    for rows, answers, prompt_h, step_h in greedy_batches(model, prompt_ids, max_new_tokens, batch_size, eos_id,
                                                          pad_id, pick=lambda states: states[-1]):
        for row, (i, answer) in enumerate(zip(rows, answers)):
            feats = torch.cat([prompt_h[row], step_h[row, :len(answer) - 1]]).float()
            out[i] = ((list(prompt_ids[i]) + answer)[:-1], feats)
    return [out[i] for i in range(len(prompt_ids))]


@torch.inference_mode()
def compute_features(model, sequences: list[list[int]], max_tokens_per_batch: int = 4096) -> FeatureSet:
    """One batched, right-padded target forward over every sequence -> FeatureSet."""
    decoder = getattr(model, model.base_model_prefix)
    order = sorted(range(len(sequences)), key=lambda i: len(sequences[i]))
    feats: dict[int, torch.Tensor] = {}
    batch: list[int] = []
    bar = tqdm(total=sum(len(s) for s in sequences), desc="target features", unit="tok")

    def flush() -> None:
        width = max(len(sequences[i]) for i in batch)
        ids = torch.zeros((len(batch), width), dtype=torch.long)
        mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, i in enumerate(batch):
            ids[row, :len(sequences[i])] = torch.tensor(sequences[i])
            mask[row, :len(sequences[i])] = 1
        hidden = decoder(input_ids=ids, attention_mask=mask).last_hidden_state  # [batch, width, hidden]
        for row, i in enumerate(batch):
            feats[i] = hidden[row, :len(sequences[i])].float()
            bar.update(len(sequences[i]))
        batch.clear()

    for i in order:
        if batch and (len(batch) + 1) * len(sequences[i]) > max_tokens_per_batch:
            flush()
        batch.append(i)
    if batch:
        flush()
    bar.close()
    return assemble(model, [(sequences[i], feats[i]) for i in range(len(sequences))])


@torch.inference_mode()
def assemble(model, pieces: list[tuple[list[int], torch.Tensor]]) -> FeatureSet:
    """(ids, features [len, hidden]) per sequence -> one flat FeatureSet, with the target's argmax labels."""
    head = model.get_output_embeddings().weight.float()  # [vocab, hidden]
    features = torch.cat([f for _, f in pieces]).float()  # [num_tokens, hidden]
    next_ids = torch.cat([(chunk @ head.T).argmax(-1) for chunk in features.split(1024)])
    ids = torch.tensor([t for s, _ in pieces for t in s], dtype=torch.long)
    lens = torch.tensor([0] + [len(s) for s, _ in pieces], dtype=torch.long)
    return FeatureSet(ids, features.half(), next_ids, lens.cumsum(0))


def concat(sets: list[FeatureSet]) -> FeatureSet:
    """Several cached shards as one set (sequence order kept, offsets shifted)."""
    if len(sets) == 1:
        return sets[0]
    starts = torch.tensor([0] + [len(fs.ids) for fs in sets]).cumsum(0)
    cu = torch.cat([sets[0].cu_seqlens[:1]] + [fs.cu_seqlens[1:] + int(a) for fs, a in zip(sets, starts)])
    return FeatureSet(torch.cat([fs.ids for fs in sets]), torch.cat([fs.features for fs in sets]),
                      torch.cat([fs.next_ids for fs in sets]), cu)


def save_features(fs: FeatureSet, directory: Path, meta: dict) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    save_file({"ids": fs.ids.int(), "features": fs.features, "next_ids": fs.next_ids.int(),
               "cu_seqlens": fs.cu_seqlens}, str(directory / "features.safetensors"))
    (directory / "meta.json").write_text(json.dumps(meta, indent=2))


def load_features(directory: Path) -> FeatureSet:
    t = load_file(str(directory / "features.safetensors"))
    return FeatureSet(t["ids"].long(), t["features"], t["next_ids"].long(), t["cu_seqlens"].long())


def generation_model(model, bf16: bool):
    """The model a shard's forwards run on: a bf16 copy of the target's weights when asked (no per-forward
    weight casts, autocast's cost at decode batch sizes), else the target itself."""
    return copy.deepcopy(model).to(torch.bfloat16) if bf16 else model


def build_or_load(target, config: FeatureCacheConfig, cache_root: Path,
                  prompt_ids: list[list[int]] | None = None) -> FeatureSet:
    """The feature set for (target, config) from cache_root, building it on first use.

    target: a LoadedModel. prompt_ids: already-encoded prompts (tests, tokenizer-less targets);
    None = the chat prompts and stdlib passages of specdec.training.prompts.
    """
    directory = Path(cache_root) / "features" / config.key(str(target.path))
    if (directory / "features.safetensors").is_file():
        return load_features(directory)
    torch.manual_seed(config.seed)
    tok = target.tokenizer
    passages: list[list[int]] = []
    if prompt_ids is None:
        from specdec.training.prompts import chat_prompts, stdlib_passages

        prompt_ids = [tok.encode(tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True,
                                                          tokenize=False), add_special_tokens=False)[-320:]
                      for p in chat_prompts(config.seed, config.num_prompts)]
        passages = [tok.encode(p)[:256] for p in stdlib_passages(config.num_passages, config.seed)]
    model = generation_model(target.model, config.bf16)
    eos_id = model.generation_config.eos_token_id
    eos_id = eos_id[0] if isinstance(eos_id, list) else eos_id
    answers = generate_answers(model, prompt_ids, config.max_new_tokens, config.generate_batch_size,
                               eos_id, eos_id if eos_id is not None else 0)
    answers = [(ids[:config.max_seq_len], f[:config.max_seq_len]) for ids, f in answers if len(ids) >= 2]
    read = compute_features(model, [p for p in passages if len(p) >= 2]) if passages else None
    pieces = answers + ([] if read is None else [
        (read.ids[a:b].tolist(), read.features[a:b]) for a, b in zip(read.cu_seqlens[:-1], read.cu_seqlens[1:])])
    fs = assemble(model, pieces)
    save_features(fs, directory, {"target": str(target.path), "config": asdict(config),
                                  "num_tokens": len(fs.ids), "num_seqs": fs.num_seqs})
    return fs
