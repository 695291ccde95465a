"""KV cache facts every layer shares, and rolling a drafter's cache back.

Invariant (kept by every path): a sequence's cache holds the keys and values of every committed
token but the last; the last committed token is the root of the next verify forward. A verify
forward appends one entry per row ([root] + tree nodes) at position `num_cached`. Committing keeps
the root and the accepted path, in path order, and drops every other row; the emitted
recovered/bonus token is not in the cache yet (it is the next root). That commit has one home,
`specdec.batch_cache.BatchCache.commit`; the sequence version is bumped by `Sequence`, once per commit.

Works on any cache whose `layers` carry `keys` / `values` tensors shaped [batch, heads, seq, head_dim]
(transformers' DynamicCache), so this module needs torch only.
"""
from __future__ import annotations


def num_cached(cache) -> int:
    """Entries currently in the cache (0 for a fresh one)."""
    return cache.get_seq_length()


def crop(cache, num_tokens: int) -> None:
    """Roll back to the first num_tokens entries (no-op when the cache is not longer)."""
    extra = num_cached(cache) - num_tokens
    if extra > 0:
        cache.crop(-extra)
