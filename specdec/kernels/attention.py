"""Attention on specdec's row-invariant kernel (attention.cpp), plugged into transformers' attention
registry under the name "specdec" (the mask comes from the sdpa mask builder).

torch's CPU flash attention splits queries and keys by the call's shape, so a verify forward's rows
and the one-token forwards of plain decoding sum in different orders and, in bfloat16 especially,
near-tied argmaxes flip. attention.cpp gives every query row its result in one fixed order that
does not depend on the other rows of the call (it tiles rows and heads of a kv group together for
speed, each row's arithmetic unchanged), so the row gets the same bits in both. It runs for up to MAX_ROWS query rows per sequence (decode and verify
steps, and prefill: the runner prefills a longer prompt in calls of at most MAX_ROWS rows, so a position's
keys and values do not depend on where a prefill chunk or a restored prefix cut the prompt). A longer call
still falls back to sdpa, whose rows depend on the call's shape.
"""
from __future__ import annotations

import functools

import torch

from specdec.kernels.build import load_kernel

NAME = "specdec"
MAX_ROWS = 128  # query rows per call on the kernel (a verify forward has at most 65)


def runs_on(model: torch.nn.Module) -> bool:
    """Whether the kernel can serve this model's attention layers (else they stay on sdpa)."""
    kernel = load_kernel()
    config = model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    first = next(model.parameters())
    return (kernel.module is not None and kernel.isa != "scalar" and first.device.type == "cpu"
            and first.dtype in (torch.float32, torch.bfloat16) and head_dim % 16 == 0 and head_dim <= 256)


@functools.lru_cache(maxsize=None)
def register_as(name: str, function) -> str:
    """Register `function` with transformers' attention registry as `name`, its masks built as sdpa's
    (once per name and process); returns the name, for config._attn_implementation."""
    from transformers import AttentionInterface
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    AttentionInterface.register(name, function)
    AttentionMaskInterface.register(name, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
    return name


def register() -> str:
    """Register "specdec" (this module's kernel)."""
    return register_as(NAME, specdec_attention)


def specdec_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, n, d], key / value [B, kv_heads, L, d], mask None (causal) | bool (True = attend) |
    additive [B, 1, n, L] -> ([B, n, H, d], None), transformers' attention-function contract."""
    if query.shape[2] > MAX_ROWS or dropout > 0.0 or query.dtype != key.dtype:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    mask = attention_mask
    if mask is not None:
        mask = mask[..., :key.shape[2]]
        if mask.dtype == torch.bool:
            hidden = torch.zeros(mask.shape, dtype=torch.float32, device=mask.device)
            mask = hidden.masked_fill_(~mask, float("-inf"))
    scale = scaling if scaling is not None else query.shape[-1] ** -0.5
    return load_kernel().module.attend(query, key, value, mask, scale), None


def install(model: torch.nn.Module, on: bool) -> bool:
    """Point the model's attention at the kernel (on, where it runs), else at sdpa (on a GPU with grouped kv
    heads: specdec.kernels.grouped, sdpa without repeating keys and values); returns whether on."""
    from specdec.kernels import grouped

    on = on and runs_on(model)
    implementation = register() if on else grouped.register() if grouped.wanted(model) else "sdpa"
    if model.config._attn_implementation != implementation:
        model.config._attn_implementation = implementation
    return on
