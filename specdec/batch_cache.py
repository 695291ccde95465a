"""The padded KV cache of a batch, kept between verify steps while the batch stays the same.

Stacking every sequence's cache into one padded tensor before a batched forward, and cutting each
sequence's rows back out after it, copies every cache twice a step (measured: 45 of 131 ms for 8
SmolLM2 sequences of ~250 tokens on this CPU). Under continuous batching the batch is the same
sequences step after step, so the stacked cache is kept, lent out of the sequences:

    cache  [B, heads, L, head_dim]   row i holds sequence i's entries in [0, lens[i]); the columns
                                     after that are stale and masked out by every forward
    lens   [B]                       entries per row

After a verify forward appended N columns at [L, L + N), `commit` moves each row's root and
accepted path to [lens[i], lens[i] + 1 + accepted) and trims the tensor to the longest row. This is
the only KV commit there is: a single sequence is a batch of one (its own cache, lent without a copy). The
shapes and the unmasked values are exactly those that stacking afresh would give, so outputs are
bitwise the same. When the batch changes, or a sequence is stepped alone, the rows go back to the
sequences (`release`) and the next batch is stacked anew.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specdec.core import kv


class BatchCache:
    def __init__(self, runner):
        self.runner = runner
        self.seqs: list = []  # the sequences whose caches are lent here, in row order
        self.cache: DynamicCache | None = None
        self.lens: list[int] = []

    def take(self, seqs: list) -> tuple[DynamicCache, list[int]]:
        """The stacked cache of seqs (in this order) and their lengths, reusing the last batch's if the same."""
        if len(seqs) == len(self.seqs) and all(a is b for a, b in zip(seqs, self.seqs)):
            return self.cache, self.lens
        self.release()
        for seq in seqs:
            if seq.cache_lender is not None:  # lent to another pool: take it back first
                seq.cache_lender.release()
        self.lens = [kv.num_cached(s.cache) for s in seqs]
        # a batch of one is its sequence's own cache, no copy
        self.cache = seqs[0].cache if len(seqs) == 1 else stack_caches(self.runner, [s.cache for s in seqs], self.lens)
        self.seqs = list(seqs)
        for seq in seqs:
            seq.cache, seq.cache_lender = None, self
        return self.cache, self.lens

    @torch.inference_mode()
    def commit(self, keep_new: list[list[int]]) -> None:
        """After a forward appended N columns at L: row i keeps L + r for r in keep_new[i] (ascending)."""
        start = max(self.lens)
        new_lens = [n + len(rows) for n, rows in zip(self.lens, keep_new)]
        sources = [torch.tensor(rows, dtype=torch.long) + start for rows in keep_new]
        end = max(new_lens)
        # a row whose kept columns already sit where they belong (a batch of one accepting a chain
        # prefix) needs no copy
        moves = [i for i, rows in enumerate(keep_new) if self.lens[i] != start or rows != list(range(len(rows)))]
        for layer in self.cache.layers:
            if layer.keys is None or layer.keys.numel() == 0:
                continue
            for i in moves:  # index_select copies before the (maybe overlapping) write
                src = sources[i]
                layer.keys[i, :, self.lens[i]:new_lens[i]] = layer.keys[i].index_select(1, src)
                layer.values[i, :, self.lens[i]:new_lens[i]] = layer.values[i].index_select(1, src)
            layer.keys = layer.keys[:, :, :end]
            layer.values = layer.values[:, :, :end]
        self.lens = new_lens

    @torch.inference_mode()
    def rollback(self) -> None:
        """Undo a failed step: drop whatever a forward appended or a commit half moved. Entries below
        each row's length are never written by a step, so trimming restores the state before it."""
        if self.cache is None:
            return
        end = max(self.lens)
        for layer in self.cache.layers:
            if layer.keys is not None and layer.keys.numel() and layer.keys.shape[2] > end:
                layer.keys = layer.keys[:, :, :end]
                layer.values = layer.values[:, :, :end]

    def release(self) -> None:
        """Give every unfinished sequence its own cache back (rows [0, lens[i]) of the stack)."""
        for i, seq in enumerate(self.seqs):
            seq.cache_lender = None
            if seq.finish_reason is None:
                seq.cache = self.cache if len(self.seqs) == 1 else select_row(self.runner, self.cache, i, self.lens[i])
        self.seqs, self.cache, self.lens = [], None, []


def stack_caches(runner, caches: list[DynamicCache], lens: list[int]) -> DynamicCache:
    """Left-aligned caches -> one cache [B, heads, max(lens), head_dim], zero-padded."""
    cache, max_len = runner.new_cache(), max(lens)
    for layer_idx in range(len(caches[0].layers)):
        layers = [c.layers[layer_idx] for c in caches]
        ref = next(layer.keys for layer in layers if layer.keys is not None and layer.keys.numel())
        keys = ref.new_zeros(len(caches), ref.shape[1], max_len, ref.shape[3])
        values = torch.zeros_like(keys)
        for i, layer in enumerate(layers):
            if lens[i]:
                keys[i, :, :lens[i]] = layer.keys[0]
                values[i, :, :lens[i]] = layer.values[0]
        cache.update(keys, values, layer_idx)
    return cache


def select_row(runner, cache: DynamicCache, row: int, length: int) -> DynamicCache:
    """Row `row`'s first `length` entries as a cache of its own."""
    out = runner.new_cache()
    for layer_idx, layer in enumerate(cache.layers):
        out.update(layer.keys[row:row + 1, :, :length].clone(), layer.values[row:row + 1, :, :length].clone(),
                   layer_idx)
    return out
