"""A Llama-family forward that walks the decoder in C++ (layer.cpp's LeanStack) instead of transformers.

With specdec's kernels in place, a one-row forward of SmolLM2 spent ~8 ms above its bandwidth floor in
transformers' per-layer Python: module calls, hooks, rotary, mask building, cache updates and ~25
small tensor ops per layer. Here one C++ call runs every layer (norm, q|k|v as one packed weight,
rotary, keys and values written into the static cache by index, attention, o, gate|up as one packed
weight, silu * up, down, residuals), and Python does only the embedding lookup, the rotary table and
the LM head. The operations and their roundings are transformers' own, so hidden states are bitwise
those of transformers' walk over the same kernels (tests/kernels/test_lean.py).

`build` says whether a model can run it; a model or call it cannot serve (another architecture,
biases, torch's kernels, a dynamic cache, prefill chunks over attention.MAX_ROWS rows, fixed-width
graph forwards) stays on transformers' walk, the reason logged once per model.
"""
from __future__ import annotations

import logging
import time

import torch

from specdec.kernels import attention
from specdec.kernels.build import load_kernel
from specdec.kernels.linear import FusedRMSNorm, KernelChoice, PackedLinear
from specdec.kernels.packing import TILE
from specdec.kernels.team import TeamPolicy
from specdec.models.static_cache import StaticKVCache

log = logging.getLogger(__name__)

ARCHITECTURES = frozenset({"llama", "mistral"})  # pre-norm, rotary, q/k/v/o and a SiLU-gated MLP, no biases


def why_not_config(config, dtype: torch.dtype) -> str:
    """Why a model of this config cannot run the lean forward in dtype ("" = its config allows it). Read
    before any weight loads too: `dtype="auto"` takes bfloat16 on a CPU only for models that run here."""
    if config.model_type not in ARCHITECTURES:
        return f"model type {config.model_type!r} is not one of {', '.join(sorted(ARCHITECTURES))}"
    if (getattr(config, "hidden_act", "silu") != "silu" or getattr(config, "sliding_window", None)
            or getattr(config, "pretraining_tp", 1) not in (None, 1)):
        return "its activation, attention window or tensor-parallel pretraining split differs from Llama's"
    if getattr(config, "attention_bias", False) or getattr(config, "mlp_bias", False):
        return "its projections have biases"
    if dtype == torch.bfloat16 and (config.hidden_size % 2 or config.intermediate_size % 2):
        return "bfloat16 products take pairs of inputs and its hidden or intermediate size is odd"
    return ""


def why_not(model: torch.nn.Module, decoder: torch.nn.Module, kernel: KernelChoice, attention_on: bool) -> str:
    """Why this model cannot run the lean forward ("" = it can)."""
    if kernel.kernel != "specdec" or not attention_on:
        return "specdec's linear and attention kernels are not both in use"
    reason = why_not_config(model.config, model.dtype)
    if reason:
        return reason
    if not isinstance(getattr(decoder, "norm", None), FusedRMSNorm):
        return "its final norm is not on specdec's RMSNorm kernel"
    for layer in decoder.layers:
        attn, mlp = layer.self_attn, layer.mlp
        parts = [getattr(attn, n, None) for n in ("q_proj", "k_proj", "v_proj", "o_proj")]
        parts += [getattr(mlp, n, None) for n in ("gate_proj", "up_proj", "down_proj")]
        if not all(isinstance(p, PackedLinear) and p.bias is None for p in parts):
            return "a projection has a bias or is not on specdec's kernel"
        norms = (getattr(layer, n, None) for n in ("input_layernorm", "post_attention_layernorm"))
        if not all(isinstance(norm, FusedRMSNorm) for norm in norms):
            return "a layer's norm is not on specdec's RMSNorm kernel"
    return ""


def _fuse(parts: list[PackedLinear]) -> tuple[torch.Tensor, list[int]]:
    """One packed weight for several layers reading the same input (their tiles one after another) and
    each part's first output column in it. Parts lying back to back in memory (the runner placed them so:
    specdec.kernels.arena) are viewed as one; others are concatenated, and their own buffers become views
    of the result: no second copy either way."""
    first = parts[0].packed
    cols, tile, end = [], 0, first.data_ptr()
    adjacent = True
    for p in parts:
        cols.append(tile * TILE)
        tile += p.packed.shape[0]
        adjacent = adjacent and p.packed.is_contiguous() and p.packed.data_ptr() == end
        end = p.packed.data_ptr() + p.packed.nbytes
    if adjacent:  # a view of the storage they share, from the first part's start
        return first.as_strided((tile, *first.shape[1:]), first.stride()), cols
    fused = torch.cat([p.packed for p in parts])  # [tiles, ...]
    at = 0
    for p in parts:
        count = p.packed.shape[0]
        p.packed = fused[at:at + count]
        at += count
    return fused, cols


class LeanForward:
    """The decoder of a model `why_not` accepts, as one LeanStack call per forward."""

    def __init__(self, model: torch.nn.Module, decoder: torch.nn.Module):
        config = model.config
        self.decoder = decoder
        self.team = TeamPolicy()  # one thread or all of torch's, by measured cost
        first = decoder.layers[0].self_attn
        self.head_dim = first.head_dim
        self.num_heads = first.q_proj.out_features // self.head_dim
        self.num_kv_heads = first.k_proj.out_features // self.head_dim
        weights, cols = [], None
        for layer in decoder.layers:
            attn, mlp = layer.self_attn, layer.mlp
            qkv, qkv_cols = _fuse([attn.q_proj, attn.k_proj, attn.v_proj])
            gate_up, gate_up_cols = _fuse([mlp.gate_proj, mlp.up_proj])
            cols = qkv_cols[1:] + gate_up_cols[1:]
            weights += [layer.input_layernorm.original.weight, qkv, attn.o_proj.packed,
                        layer.post_attention_layernorm.original.weight, gate_up, mlp.down_proj.packed]
        eps = decoder.norm.original.variance_epsilon
        self.stack = load_kernel().module.LeanStack(
            weights, decoder.norm.original.weight, self.num_heads, self.num_kv_heads, self.head_dim,
            config.hidden_size, decoder.layers[0].mlp.gate_proj.out_features,
            cols[0], cols[1], cols[2], float(eps), float(first.scaling))

    def runs(self, cache, num_rows: int) -> bool:
        """Whether this call can run here: a static cache written by index, a decode or verify step."""
        return (isinstance(cache, StaticKVCache) and cache.write_positions is None
                and num_rows <= attention.MAX_ROWS)

    def __call__(self, input_ids: torch.Tensor, cache: StaticKVCache, attn_bias: torch.Tensor | None,
                 positions: torch.Tensor | None, keep: tuple[int, ...], seq_rows: list[int] | None = None
                 ) -> tuple[torch.Tensor, dict[int, torch.Tensor]]:
        """input_ids [B, n]; attn_bias [B|1, 1, n, cached + n] additive or None (causal); positions [B|1, n]
        or None (the cache's end onwards) -> (hidden [B, n, H] after the final norm, {k: hidden after k layers}).
        seq_rows (ragged): sequence b's first seq_rows[b] rows are all it has (a mask is needed); the rest
        are never computed, and the results hold the sequences' rows packed, [sum seq_rows, H]."""
        batch, n = input_ids.shape
        flat = None
        if seq_rows is not None:  # [M] indices of the rows that exist in the padded [B * n]
            rows = torch.tensor(seq_rows, device=input_ids.device)
            flat = (torch.arange(n, device=input_ids.device) < rows[:, None]).reshape(-1).nonzero().squeeze(1)
        embeds = self.decoder.embed_tokens(input_ids if flat is None else input_ids.reshape(-1)[flat])  # [B, n | M, H]
        if cache.store is None:
            cache.allocate(embeds.new_empty(batch, self.num_kv_heads, n, self.head_dim))
        start = cache.reserve(n)
        if positions is None:
            positions = torch.arange(start, start + n, device=input_ids.device).unsqueeze(0)
        if flat is not None:
            positions = positions.expand(batch, n).reshape(1, -1)[:, flat]  # [1, M]
        cos, sin = self.decoder.rotary_emb(embeds, positions)  # [B|1, n | M, d] in the model's dtype
        if flat is None:
            cos, sin = cos.expand(batch, n, -1).contiguous(), sin.expand(batch, n, -1).contiguous()
        else:
            cos, sin = cos[0].contiguous(), sin[0].contiguous()
        mask = None
        if attn_bias is not None:
            mask = attn_bias[..., :start + n].to(torch.float32).expand(batch, 1, n, start + n)
        num_rows = batch * n if flat is None else len(flat)
        threads = self.team.threads(num_rows, torch.get_num_threads())
        began = time.perf_counter()
        out = self.stack.forward(embeds, cache.store, start, cos, sin, mask, list(keep), threads, list(seq_rows or ()))
        self.team.record(num_rows, threads, time.perf_counter() - began)
        cache.length = start + n  # every layer has written: the entries are in
        return out[0], dict(zip(keep, out[1:]))


def build(model: torch.nn.Module, decoder: torch.nn.Module, kernel: KernelChoice, attention_on: bool,
          wanted: bool) -> LeanForward | None:
    """The lean forward for this model, or None (transformers' walk), said once per model."""
    reason = "not asked for" if not wanted else why_not(model, decoder, kernel, attention_on)
    lean = LeanForward(model, decoder) if not reason else None
    said = reason or "on"
    if getattr(model, "_specdec_lean_forward", None) != said:
        log.info("lean forward: %s", said if not reason else f"transformers' walk ({reason})")
        model._specdec_lean_forward = said
    return lean
