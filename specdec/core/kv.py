"""Committing a verify step into a KV cache, and rolling a cache back.

Invariant (kept by the engine and the target worker): a sequence's cache holds the keys and values
of every committed token but the last; the last committed token is the root of the next verify
forward. A verify forward appends one entry per row ([root] + tree nodes) at position `num_cached`.
Committing keeps the root and the accepted path, in path order, and drops every other row; the
emitted recovered/bonus token is not in the cache yet (it is the next root). The sequence version
is bumped by whoever owns the sequence, once per commit.

Works on any cache whose `layers` carry `keys` / `values` tensors shaped [batch, heads, seq, head_dim]
(transformers' DynamicCache), so this module needs torch only.
"""
from __future__ import annotations

import torch


def num_cached(cache) -> int:
    """Entries currently in the cache (0 for a fresh one)."""
    return cache.get_seq_length()


@torch.inference_mode()  # caches are filled under inference mode; in-place writes must be too
def keep_rows(cache, start: int, rows: list[int]) -> None:
    """Keep entries [0, start) plus start + r for r in rows (ascending), dropping all later ones.

    After a verify forward at `start`, rows = [0] + accepted rows: root and accepted path.
    """
    contiguous = rows == list(range(len(rows)))
    end = start + len(rows)
    src = None if contiguous else torch.tensor(rows, dtype=torch.long) + start
    for layer in cache.layers:
        if layer.keys is None or layer.keys.numel() == 0:
            continue
        if src is not None:  # gather the path (reads happen before the overlapping writes)
            layer.keys[:, :, start:end] = layer.keys.index_select(2, src)
            layer.values[:, :, start:end] = layer.values.index_select(2, src)
        layer.keys = layer.keys[:, :, :end]
        layer.values = layer.values[:, :, :end]


def crop(cache, num_tokens: int) -> None:
    """Roll back to the first num_tokens entries (no-op when the cache is not longer)."""
    extra = num_cached(cache) - num_tokens
    if extra > 0:
        cache.crop(-extra)
