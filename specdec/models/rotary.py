"""Rotary position tables: each position's cos and sin computed once per model and looked up after.

Why. Greedy speculative decoding equals plain decoding only if a row's forward gives the same bits
however the rows are grouped. transformers' rotary embedding recomputes cos/sin for every forward's
positions with elementwise torch ops, and those bits proved not to be a function of the position
alone: on a 2-core AMX Xeon, in bfloat16, the first forward of a process got cos/sin differing by one
bf16 step at some positions of one half of the call (`benchmarks/first_forward_check.py`: 3 of 6
fresh processes; later forwards always agreed). A rotated key one step off is a different cache entry
for the rest of the sequence, and a first generation then differed from the same prompt decoded later.

Here a table [positions, head_dim] is built once, in float64 from the module's own inverse
frequencies (`cos(position * inv_freq)` rounded once to the model's dtype: a value no thread split,
vector width or first call can change), for every position the model states it takes
(`max_position_embeddings`), and every forward gathers its rows: no host-side look at the positions,
so a forward stays capturable as a CUDA graph (specdec.graphs). On a CPU a position past the table
grows it. Only the plain ("default") rope is replaced; scaled variants, whose frequencies depend on
the sequence length, keep transformers' module.
"""
from __future__ import annotations

import torch

MIN_POSITIONS = 4096


class RotaryTable(torch.nn.Module):
    """A drop-in for a default-rope module: forward(x, position_ids) -> (cos, sin) [B, n, d] in x's dtype."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.original = original  # kept: its attributes (config, rope_type) stay reachable
        self.register_buffer("inv_freq", original.inv_freq.detach().clone(), persistent=False)
        self.attention_scaling = float(getattr(original, "attention_scaling", 1.0))
        stated = getattr(getattr(original, "config", None), "max_position_embeddings", None)
        self.num_positions = int(stated or getattr(original, "max_seq_len_cached", 0) or MIN_POSITIONS)
        self.tables: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}  # dtype -> (cos, sin) [P, d]

    def table(self, num_positions: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [P, d] for positions 0..P-1 (P >= num_positions), in `dtype`, built on first need."""
        have = self.tables.get(dtype)
        if have is None or have[0].shape[0] < num_positions:
            size = max(MIN_POSITIONS, num_positions, 2 * (have[0].shape[0] if have is not None else 0))
            positions = torch.arange(size, dtype=torch.float64, device=self.inv_freq.device)
            freqs = positions[:, None] * self.inv_freq.double()[None, :]  # [P, d/2]
            angles = torch.cat((freqs, freqs), dim=-1)  # [P, d]: the layout rotate_half expects
            have = ((angles.cos() * self.attention_scaling).to(dtype), (angles.sin() * self.attention_scaling).to(dtype))
            self.tables[dtype] = have
        return have

    @torch.no_grad()
    def forward(self, x: torch.Tensor, position_ids: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """x: any tensor of the forward (its dtype and device); position_ids [B, n] -> cos, sin [B, n, d]."""
        cos, sin = self.table(self.num_positions, x.dtype)
        if position_ids.device.type == "cpu" and position_ids.numel():  # past the stated limit: grow (no sync here)
            top = int(position_ids.max()) + 1
            if top > cos.shape[0]:
                cos, sin = self.table(top, x.dtype)
        index = position_ids.to(device=cos.device, dtype=torch.long)
        return cos[index], sin[index]


def install(decoder: torch.nn.Module) -> bool:
    """Swap the decoder's default-rope module for a RotaryTable (in place, idempotent). Returns whether
    the decoder's rotary embedding is now table-driven."""
    rotary = getattr(decoder, "rotary_emb", None)
    if isinstance(rotary, RotaryTable):
        return True
    if rotary is None or getattr(rotary, "rope_type", "default") != "default" or not hasattr(rotary, "inv_freq"):
        return False
    decoder.rotary_emb = RotaryTable(rotary)
    return True
