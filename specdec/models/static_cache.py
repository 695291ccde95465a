"""A preallocated KV cache: one buffer per cache, written in place, committed by index bookkeeping.

transformers' DynamicCache appends with `torch.cat` (every forward copies the whole cache of every
layer) and is rolled back by slicing. Here every layer's keys and values are views into one store
allocated once per cache:

    store  [num_layers, 2, batch, kv_heads, capacity, head_dim]   2 = keys, values
    length                                                         entries in use (an int)

A forward writes its new entries at [length, length + n) and attends to the view [:, :, :length + n]
(no copy, and attention costs what the used length costs, not the capacity). Cropping, rolling back
and trimming after a commit only change `length`. A commit's row moves (the root and accepted path
into place, `specdec.batch_cache`) are one gather and one scatter over the whole store instead of
two copies per layer. Capacity is fixed when the caller knows the sequence's bound (prompt +
max_new_tokens + the most verify rows); a cache that would overflow grows by doubling, once per
doubling, so a caller that guessed low (a drafter's session) is slower, never wrong.

The layer class follows transformers' cache-layer protocol (`update`, `get_seq_length`,
`get_mask_sizes`, `crop`), so the model's own forward drives it unchanged; masks are the callers'
explicit 4D tree masks or transformers' causal mask over `length + n` columns, exactly as with a
DynamicCache, which is why outputs are the same token for token.
"""
from __future__ import annotations

import weakref

import torch
from transformers.cache_utils import Cache, CacheLayerMixin

DEFAULT_CAPACITY = 256  # entries a cache of unknown bound starts with (it doubles when full)


class StaticLayer(CacheLayerMixin):
    """One layer's view into its cache's store; `length` lives on the cache (all layers agree)."""

    is_sliding = False
    is_croppable = True
    is_compileable = False  # views change length every step; graphs run it at fixed width (write_positions)

    def __init__(self, owner: StaticKVCache, index: int):
        super().__init__()
        # a weak reference: no cycle between a cache and its layers, so a dropped cache (and its store)
        # is freed at once rather than at the next garbage collection
        self._owner, self.index = weakref.ref(owner), index

    @property
    def owner(self) -> StaticKVCache:
        return self._owner()

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.owner.allocate(key_states)

    def bind(self) -> None:
        """Point keys / values at this layer's slot of the (new) store."""
        store = self.owner.store
        self.keys, self.values = store[self.index, 0], store[self.index, 1]
        self.dtype, self.device = store.dtype, store.device
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
        """key_states / value_states [batch, kv_heads, n, head_dim] -> keys, values [.., length + n, ..] (views).

        Fixed width (`owner.write_positions` set, specdec.graphs): the entries go to those columns and
        the whole capacity is returned, so shapes and addresses do not change from step to step and
        no Python state is read (what a captured CUDA graph replays); the caller keeps `length`."""
        owner = self.owner
        positions = owner.write_positions
        if positions is not None:
            self.keys.index_copy_(2, positions, key_states)
            self.values.index_copy_(2, positions, value_states)
            return self.keys, self.values
        if owner.store is None:
            owner.allocate(key_states)
        start = owner.pending_start(self.index, key_states.shape[-2])
        end = start + key_states.shape[-2]
        self.keys[:, :, start:end].copy_(key_states)
        self.values[:, :, start:end].copy_(value_states)
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_mask_sizes(self, query_length: int) -> tuple[int, int]:
        return self.owner.length + query_length, 0

    def get_seq_length(self) -> int:
        return self.owner.length

    def get_max_length(self) -> int:
        return self.owner.capacity

    def crop(self, tokens_to_remove: int) -> None:
        self.owner.crop(tokens_to_remove)

    def reset(self) -> None:
        self.owner.trim(0)


class StaticKVCache(Cache):
    """A cache of `num_layers` layers over one store. Every layer of a forward writes at the length
    the forward started from; the length moves on when the last layer has written, so a forward that
    dies halfway leaves the length as it was (its partial writes sit beyond it, unseen)."""

    def __init__(self, num_layers: int, capacity: int = DEFAULT_CAPACITY):
        self.capacity = max(1, int(capacity))
        self.length = 0
        self.store: torch.Tensor | None = None  # [layers, 2, batch, kv_heads, capacity, head_dim]
        self.write_positions: torch.Tensor | None = None  # [n] columns of a fixed-width forward (specdec.graphs)
        super().__init__(layers=[StaticLayer(self, i) for i in range(num_layers)])

    # -- the store ------------------------------------------------------------------------------
    def allocate(self, like: torch.Tensor, batch: int | None = None) -> None:
        """Allocate the store for keys shaped like `like` [batch, kv_heads, n, head_dim]."""
        b, heads, _, head_dim = like.shape
        self.store = like.new_zeros(len(self.layers), 2, batch or b, heads, self.capacity, head_dim)
        for layer in self.layers:
            layer.bind()

    def adopt(self, store: torch.Tensor, length: int) -> None:
        """Take a filled store [layers, 2, batch, kv_heads, capacity, head_dim] with `length` entries in use."""
        self.store, self.capacity, self.length = store, store.shape[4], length
        for layer in self.layers:
            layer.bind()

    def reserve(self, num_new: int) -> int:
        """Where a forward's `num_new` entries go (the store grown first if they would not fit); the
        length moves on only when the caller says every layer has written (`pending_start`, or the lean
        forward setting `length` itself)."""
        if self.length + num_new > self.capacity:
            self._grow(self.length + num_new)
        return self.length

    def pending_start(self, layer_index: int, num_new: int) -> int:
        """Where this forward's entries go; grows the store first if they would not fit."""
        start = self.reserve(num_new)
        if layer_index == len(self.layers) - 1:  # the forward's last layer: its entries are all in
            self.length = start + num_new
        return start

    def _grow(self, needed: int) -> None:
        capacity = self.capacity
        while capacity < needed:
            capacity *= 2
        store = self.store.new_zeros(*self.store.shape[:4], capacity, self.store.shape[5])
        store[:, :, :, :, :self.capacity] = self.store
        self.adopt(store, self.length)

    # -- bookkeeping (no data moves) -------------------------------------------------------------
    def trim(self, length: int) -> None:
        """Keep the first `length` entries (a no-op when fewer are in use); drops a half-done forward."""
        self.length = min(self.length, max(0, length))

    def crop(self, tokens_to_remove: int) -> None:
        """transformers' convention: a negative count removes that many entries from the end."""
        if tokens_to_remove < 0:
            self.trim(self.length + tokens_to_remove)
        elif tokens_to_remove > 0:
            self.trim(tokens_to_remove)

    def get_seq_length(self, layer_idx: int = 0) -> int:
        return self.length

    @property
    def batch_size(self) -> int:
        return 0 if self.store is None else self.store.shape[2]
