"""Grouped-query attention for masked multi-row forwards on GPUs, without repeating keys and values.

A verify forward is masked (its tree mask) and has several query rows. For such a call transformers'
sdpa attention repeats every key and value head `groups` times (`repeat_kv`) before torch's kernel
runs, because CUDA's fused kernels take no mask together with `enable_gqa`. At batch 32 and 1,024
cache columns that copy is ~17 GB a forward for an 8B Llama (32 layers, 8 kv heads, 4 groups), and
it made a 2-row verify step cost 3.4x a 1-row one on an H200 (the one-row step avoids it: transformers
folds a single query's heads onto its kv head). This does the same fold for n rows:

    query  [B, H, n, d] = [B, kv, groups, n, d]  ->  [B, kv, groups * n, d]   (row r * n + i: head r, row i)
    mask   [B, 1, n, L]                          ->  [B, 1, groups * n, L]    (row r * n + i sees row i's mask)
    out    [B, kv, groups * n, d]                ->  [B, n, H, d]

so each kv head is read once by the groups * n rows that use it. Query head h maps to kv head
h // groups, as in repeat_kv. The arithmetic per row is unchanged (one softmax over the same keys),
so outputs match sdpa's up to its own kernel choice. Calls it does not cover (one row, no mask, no
groups, dropout, a position bias, logit soft-capping or attention sinks) go to transformers' sdpa as
they are, which runs them or refuses them as it always did.
"""
from __future__ import annotations

import torch

NAME = "specdec_grouped"


def wanted(model: torch.nn.Module) -> bool:
    """Whether a model's attention should run here: on a CUDA device, with grouped kv heads."""
    config = model.config
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    return next(model.parameters()).device.type == "cuda" and kv_heads < heads


def register() -> str:
    """Register NAME (specdec.kernels.attention.register_as)."""
    from specdec.kernels.attention import register_as

    return register_as(NAME, grouped_attention)


def grouped_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      **kwargs) -> tuple[torch.Tensor, None]:
    """query [B, H, n, d], key / value [B, kv, L, d], mask bool (True = attend) | additive [B, 1, n, >= L]
    -> ([B, n, H, d], None), transformers' attention-function contract."""
    batch, heads, rows, dim = query.shape
    kv_heads = key.shape[1]
    groups = heads // kv_heads
    mask = attention_mask
    if (groups == 1 or rows == 1 or mask is None or dropout > 0.0 or mask.dim() != 4 or mask.shape[1] != 1
            or any(kwargs.get(name) is not None for name in ("position_bias", "softcap", "s_aux"))):
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    # [B, 1, groups * n, L]: a copy per layer of the mask (n x L per sequence, against the groups x L x d
    # keys and values per kv head that repeat_kv copied)
    mask = mask[..., :key.shape[2]].repeat(1, 1, groups, 1)
    packed = query.reshape(batch, kv_heads, groups * rows, dim)
    out = torch.nn.functional.scaled_dot_product_attention(packed, key, value, attn_mask=mask, scale=scaling)
    return out.reshape(batch, heads, rows, dim).transpose(1, 2).contiguous(), None
