"""The padded KV cache of a batch, kept between verify steps while the batch stays the same.

Stacking every sequence's cache into one padded tensor before a batched forward, and cutting each
sequence's rows back out after it, copies every cache twice a step (measured: 45 of 131 ms for 8
SmolLM2 sequences of ~250 tokens on this CPU). Under continuous batching the batch is the same
sequences step after step, so the stacked cache is kept, lent out of the sequences:

    cache  [B, heads, L, head_dim]   row i holds sequence i's entries in [0, lens[i]); the columns
                                     after that are stale and masked out by every forward
    lens   [B]                       entries per row

After a verify forward appended N columns at [L, L + N), `commit` moves each row's root and
accepted path to [lens[i], lens[i] + 1 + accepted) and trims the cache to the longest row (a
preallocated cache, `specdec.models.static_cache`: all rows of all layers in one gather and one
scatter, and a trim that only sets its length; a DynamicCache: two copies per layer and a slice). This is
the only KV commit there is: a single sequence is a batch of one (its own cache, lent without a copy). The
shapes and the unmasked values are exactly those that stacking afresh would give, so outputs are
bitwise the same. When the batch changes, a static store's rows stay where they are
(`specdec.kv_rows.RowStore`): the step is arranged so that sequences keep their rows, sequences that
join are copied in, sequences sitting a step out are parked in spare rows, and a sequence gets its own
cache back only when no spare row is left for it (`release` gives every one back).
A DynamicCache, or fixed-width graphs (which read a cache's whole capacity), restack at each change.
"""
from __future__ import annotations

import torch
from transformers import DynamicCache

from specdec.core import kv
from specdec.kv_rows import RowStore
from specdec.models.static_cache import StaticKVCache


class BatchCache:
    def __init__(self, runner):
        self.runner = runner
        self.seqs: list = []  # the sequences stepped last, in row order
        self.cache: DynamicCache | StaticKVCache | None = None
        self.lens: list[int] = []
        self.capacities: list[int] = []  # each sequence's own cache capacity (static caches), for release
        self.own = False  # self.cache is seqs[0]'s own cache (a batch of one, lent without a copy)
        self.rows: RowStore | None = None  # a static store whose rows sequences keep across batches

    def arrange(self, seqs: list) -> list[int]:
        """The order to step seqs in (order[k]: the index in seqs of row k) so that sequences whose rows
        are kept here stay where they are."""
        self._keep_rows()
        if self.rows is None:
            return list(range(len(seqs)))
        return self.rows.order(seqs)

    def take(self, seqs: list) -> tuple[DynamicCache | StaticKVCache, list[int]]:
        """The stacked cache of seqs (in this order) and their lengths, reusing the last batch's if the same."""
        if len(seqs) == len(self.seqs) and all(a is b for a, b in zip(seqs, self.seqs)):
            return self.cache, self.lens
        for seq in seqs:
            if seq.cache_lender is not None and seq.cache_lender is not self:  # lent to another pool
                seq.cache_lender.release()
        self._keep_rows()
        if self.rows is not None:
            self.cache, self.lens = self.rows.place(self.runner, seqs, self._give_back)
        else:
            self.release()
            self.lens = [kv.num_cached(s.cache) for s in seqs]
            self.capacities = [getattr(s.cache, "capacity", 0) for s in seqs]
            # a batch of one is its sequence's own cache, no copy
            self.own = len(seqs) == 1
            self.cache = seqs[0].cache if self.own else stack_caches(self.runner, [s.cache for s in seqs], self.lens)
        self.seqs = list(seqs)
        for seq in seqs:
            seq.cache, seq.cache_lender = None, self
        return self.cache, self.lens

    def _keep_rows(self) -> None:
        """Keep the stacked static store's rows from now on (the forward has allocated it), unless
        forwards read a cache's whole capacity (fixed-width graphs want zeros everywhere: they restack)."""
        if self.own or not isinstance(self.cache, StaticKVCache) or self.cache.store is None \
                or _reads_whole_capacity(self.runner):
            return
        capacities = self.capacities
        if self.rows is not None:
            if self.rows.backs(self.cache):
                return
            # a forward outgrew the store: the batch's rows went to a store of their own; the parked go home
            capacities = [self.rows.rows[k].capacity for k in range(len(self.seqs))]
            for r in self.rows.live_rows():
                if r >= len(self.seqs):
                    self._give_back(r)
        self.rows = RowStore.adopt(self.cache.store, self.seqs, self.lens, capacities, self.cache.length)

    @torch.inference_mode()
    def commit(self, keep_new: list[list[int]]) -> None:
        """After a forward appended N columns at L: row i keeps L + r for r in keep_new[i] (ascending)."""
        start = max(self.lens)
        new_lens = [n + len(rows) for n, rows in zip(self.lens, keep_new)]
        # a row whose kept columns already sit where they belong (a batch of one accepting a chain
        # prefix) needs no copy
        moves = [i for i, rows in enumerate(keep_new) if self.lens[i] != start or rows != list(range(len(rows)))]
        if moves and isinstance(self.cache, StaticKVCache):
            _move_static(self.cache, moves, [self.lens[i] for i in moves], [keep_new[i] for i in moves], start)
        elif moves:
            sources = {i: torch.tensor(keep_new[i], dtype=torch.long) + start for i in moves}
            for layer in self.cache.layers:
                if layer.keys is None or layer.keys.numel() == 0:
                    continue
                for i in moves:  # index_select copies before the (maybe overlapping) write
                    src = sources[i].to(layer.keys.device)
                    layer.keys[i, :, self.lens[i]:new_lens[i]] = layer.keys[i].index_select(1, src)
                    layer.values[i, :, self.lens[i]:new_lens[i]] = layer.values[i].index_select(1, src)
        if self.rows is not None and self.rows.backs(self.cache):
            self.rows.committed(new_lens, self.cache.length)  # the forward wrote [L, L + N) of every row
        kv.trim(self.cache, max(new_lens))
        self.lens = new_lens

    @torch.inference_mode()
    def rollback(self) -> None:
        """Undo a failed step: drop whatever a forward appended or a commit half moved. Entries below
        each row's length are never written by a step, so trimming restores the state before it."""
        if self.cache is not None:
            kv.trim(self.cache, max(self.lens))

    def settle(self) -> None:
        """After a step: if no unfinished sequence is left here, free the store."""
        if self.rows is not None:
            live = self.rows.live_rows()
        else:
            live = [i for i, seq in enumerate(self.seqs) if seq.finish_reason is None]
        if not live:
            self.release()

    def release(self) -> None:
        """Give every unfinished sequence its own cache back (its row's first `lens` entries)."""
        if self.rows is not None and not self.rows.backs(self.cache):
            self._keep_rows()  # the batch's rows first, from the store a forward outgrew into
        if self.rows is not None:
            for r in self.rows.live_rows():
                self._give_back(r)
            for row in self.rows.rows:
                if row is not None:
                    row.seq.cache_lender = None
        else:
            for i, seq in enumerate(self.seqs):
                seq.cache_lender = None
                if seq.finish_reason is None:
                    seq.cache = (self.cache if self.own else
                                 select_row(self.runner, self.cache, i, self.lens[i], self.capacities[i]))
        self.seqs, self.cache, self.lens, self.capacities, self.own, self.rows = [], None, [], [], False, None

    def _give_back(self, row: int) -> None:
        """The sequence in the kept store's `row` gets its own cache again."""
        kept = self.rows.rows[row]
        kept.seq.cache = row_cache(self.runner, self.rows.store, row, kept.length, kept.capacity)
        kept.seq.cache_lender = None


def _move_static(cache: StaticKVCache, rows: list[int], lens: list[int], keep: list[list[int]], start: int) -> None:
    """Row rows[j] keeps columns start + keep[j] at [lens[j], lens[j] + len(keep[j])): every layer,
    keys and values, all rows at once. The gather copies before the scatter writes (they may overlap)."""
    device = cache.store.device
    batch_rows = torch.tensor([r for r, k in zip(rows, keep) for _ in k], dtype=torch.long, device=device)  # [M]
    src = torch.tensor([start + c for k in keep for c in k], dtype=torch.long, device=device)  # [M]
    dst = torch.tensor([n + j for n, k in zip(lens, keep) for j in range(len(k))], dtype=torch.long, device=device)
    store = cache.store  # [layers, 2, batch, kv_heads, capacity, head_dim]
    store[:, :, batch_rows, :, dst] = store[:, :, batch_rows, :, src]  # [M, layers, 2, kv_heads, head_dim]


def stack_caches(runner, caches: list, lens: list[int]):
    """Left-aligned caches -> one cache [B, heads, max(lens), head_dim], zero-padded (a static cache:
    capacity the largest of theirs, so every row keeps the room its sequence was given)."""
    max_len = max(lens)
    if isinstance(caches[0], StaticKVCache):
        out = runner.new_cache(max(c.capacity for c in caches))
        ref = next((c.store for c in caches if c.store is not None), None)
        if ref is None:  # nothing cached anywhere yet: allocated by the first forward, batch-wide
            return out
        whole = _reads_whole_capacity(runner)
        shape = (ref.shape[0], 2, len(caches), ref.shape[3], out.capacity, ref.shape[5])
        store = ref.new_zeros(shape) if whole else ref.new_empty(shape)
        for i, c in enumerate(caches):
            if lens[i]:
                store[:, :, i, :, :lens[i]] = c.store[:, :, 0, :, :lens[i]]
            if not whole:  # the gap the mask hides is read all the same: it must hold finite values
                store[:, :, i, :, lens[i]:max_len] = 0
        out.adopt(store, max_len)
        return out
    cache = runner.new_cache()
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


def select_row(runner, cache, row: int, length: int, capacity: int = 0):
    """Row `row`'s first `length` entries as a cache of its own (a static one of `capacity` entries)."""
    if isinstance(cache, StaticKVCache):
        if cache.store is None:
            return runner.new_cache(max(capacity, length))
        return row_cache(runner, cache.store, row, length, capacity)
    out = runner.new_cache()
    for layer_idx, layer in enumerate(cache.layers):
        out.update(layer.keys[row:row + 1, :, :length].clone(), layer.values[row:row + 1, :, :length].clone(),
                   layer_idx)
    return out


def row_cache(runner, store: torch.Tensor, row: int, length: int, capacity: int = 0) -> StaticKVCache:
    """Row `row` of store [layers, 2, B, kv_heads, capacity, head_dim], its first `length` entries, as a
    static cache of its own."""
    out = runner.new_cache(max(capacity, length))
    shape = (*store.shape[:2], 1, store.shape[3], out.capacity, store.shape[5])
    own = store.new_zeros(shape) if _reads_whole_capacity(runner) else store.new_empty(shape)
    own[:, :, 0, :, :length] = store[:, :, row, :, :length]
    out.adopt(own, length)
    return out


def _reads_whole_capacity(runner) -> bool:
    """Whether forwards attend over a static cache's whole capacity (fixed-width graphs, specdec.graphs).
    Otherwise a forward writes its columns at [length, length + n) before it reads them, so a restacked
    store's columns past the longest row need no zeros: zeroing them, for every sequence at every change of
    the batch, cost a served target worker about as much as its forwards."""
    return getattr(runner, "graphs", None) is not None
