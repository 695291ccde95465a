"""KV cache facts every layer shares, and rolling a drafter's cache back.

Invariant (kept by every path): a sequence's cache holds the keys and values of every committed
token but the last; the last committed token is the root of the next verify forward. A verify
forward appends one entry per row ([root] + tree nodes) at position `num_cached`. Committing keeps
the root and the accepted path, in path order, and drops every other row; the emitted
recovered/bonus token is not in the cache yet (it is the next root). That commit has one home,
`specdec.batch_cache.BatchCache.commit`; the sequence version is bumped by `Sequence`, once per commit.

Works on any cache whose `layers` carry `keys` / `values` tensors shaped [batch, heads, seq, head_dim]
(transformers' DynamicCache), or that keeps its length by bookkeeping and says so with a `trim`
method (the preallocated `specdec.models.static_cache.StaticKVCache`), so this module needs torch only.
"""
from __future__ import annotations


def num_cached(cache) -> int:
    """Entries currently in the cache (0 for a fresh one)."""
    return cache.get_seq_length()


def entries(cache) -> list[tuple]:
    """Per layer, (keys, values) of the entries in use: [batch, heads, num_cached, head_dim] each
    (views; a preallocated cache's buffers run past them)."""
    n = num_cached(cache)
    return [(None, None) if layer.keys is None else (layer.keys[:, :, :n], layer.values[:, :, :n])
            for layer in cache.layers]


def crop(cache, num_tokens: int) -> None:
    """Roll back to the first num_tokens entries (no-op when the cache is not longer)."""
    extra = num_cached(cache) - num_tokens
    if extra > 0:
        cache.crop(-extra)


def trim(cache, num_tokens: int) -> None:
    """Keep the first num_tokens columns of every layer, even where a forward that died halfway left
    some layers longer than others (crop trusts the first layer's length; this does not)."""
    if hasattr(cache, "trim"):  # a preallocated cache: bookkeeping only
        cache.trim(num_tokens)
        return
    for layer in cache.layers:
        if layer.keys is not None and layer.keys.numel() and layer.keys.shape[2] > num_tokens:
            layer.keys = layer.keys[:, :, :num_tokens]
            layer.values = layer.values[:, :, :num_tokens]
