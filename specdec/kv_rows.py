"""A preallocated KV store whose rows sequences keep from one batch to the next.

Under continuous batching the batch changes often (a sequence finishes, a new one is prefilled, a
sequence waits a step for its draft), and most of it stays. Restacking every sequence's cache at each
change (copy every row out, copy every row back in) cost a served target at 8 users about a seventh
of its decode loop. Here a sequence keeps its row:

    store  [layers, 2, R, kv_heads, capacity, head_dim]   R rows; a batch of B uses rows [0, B)
    rows   [R]   a Row per row (its sequence, entries in use, the sequence's own capacity, and how
                 far its columns are finite), or None; rows >= B hold sequences parked between steps

A forward reads every column [0, L) of every row it steps, masked or not, so the columns a mask
hides must be finite (0 * NaN is NaN); `finite` says how far that already holds, and only the gap
past it is zeroed. A new batch costs one copy per sequence that joins, one per row moved, and one per
sequence given back (none for a sequence that finished): not two copies of every cache. A parked
sequence its owner dropped unfinished (a cancelled request) holds its row until the row is wanted.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from specdec.models.static_cache import StaticKVCache


@dataclass
class Row:
    seq: object  # the Sequence whose entries the row holds
    length: int  # entries in use
    capacity: int  # the sequence's own cache capacity, for when it is given back
    finite: int  # columns [0, finite) hold finite values (written, or zeroed)


class RowStore:
    def __init__(self, store: torch.Tensor, rows: list[Row | None]):
        self.store = store  # [layers, 2, R, kv_heads, capacity, head_dim]
        self.rows = rows + [None] * (store.shape[2] - len(rows))  # [R]; rows >= B hold parked sequences

    @classmethod
    def adopt(cls, store: torch.Tensor, seqs: list, lens: list[int], capacities: list[int], length: int) -> RowStore:
        """The rows of a stacked cache's store after a forward: every row finite up to `length`."""
        return cls(store, [Row(seq, n, c, length) for seq, n, c in zip(seqs, lens, capacities)])

    def backs(self, cache: StaticKVCache) -> bool:
        """Whether `cache` is still a view of this store (a forward that outgrew it got a store of its own)."""
        return cache.store is not None and cache.store.data_ptr() == self.store.data_ptr() \
            and cache.store.shape[4] == self.store.shape[4]

    def _held(self) -> dict[int, int]:
        return {id(row.seq): r for r, row in enumerate(self.rows) if row is not None}

    def order(self, seqs: list) -> list[int]:
        """order[k]: the index in seqs of the sequence row k should hold, keeping every sequence that
        already sits in a row below len(seqs) where it is."""
        held = self._held()
        order: list[int | None] = [None] * len(seqs)
        rest = []
        for j, seq in enumerate(seqs):
            r = held.get(id(seq))
            if r is not None and r < len(seqs):
                order[r] = j
            else:
                rest.append(j)
        free = iter(k for k in range(len(seqs)) if order[k] is None)
        for j in rest:
            order[next(free)] = j
        return order

    @torch.inference_mode()
    def place(self, runner, seqs: list, give_back) -> tuple[StaticKVCache, list[int]]:
        """Rows [0, B) hold seqs in this order: sequences already here move if they must, the others'
        own caches are copied in, sequences in the way are parked in a free row >= B or, if none is
        left, given back (`give_back(row)`). Returns the batch's cache (a view of rows [0, B)) and lens."""
        batch = len(seqs)
        for r, row in enumerate(self.rows):  # a finished sequence is never stepped again
            if row is not None and row.seq.finish_reason is not None:
                row.seq.cache_lender, self.rows[r] = None, None
        wanted = {id(s) for s in seqs}
        held = self._held()
        size = max(len(self.rows), batch)
        target = {held[id(s)]: k for k, s in enumerate(seqs) if id(s) in held}  # old row -> new row
        parked = {r for r, row in enumerate(self.rows) if row is not None and id(row.seq) not in wanted and r >= batch}
        spare = [r for r in range(batch, size) if r not in parked]
        for r, row in enumerate(self.rows):
            if row is None or id(row.seq) in wanted:
                continue
            if r >= batch:
                target[r] = r  # parked already, stays
            elif spare:
                target[r] = spare.pop(0)
            else:
                give_back(r)
                self.rows[r] = None
        joining = [k for k, s in enumerate(seqs) if id(s) not in held]
        capacity = max([self.store.shape[4]] + [seqs[k].cache.capacity for k in joining])
        self._move(target, size, capacity)
        for k in joining:
            self._copy_in(k, seqs[k])
        length = max(self.rows[k].length for k in range(batch))
        for k in range(batch):  # the gap a mask hides is read all the same: finite values there
            row = self.rows[k]
            if row.finite < length:
                self.store[:, :, k, :, row.finite:length] = 0
                row.finite = length
        cache = runner.new_cache(self.store.shape[4])
        cache.adopt(self.store[:, :, :batch], length)
        return cache, [self.rows[k].length for k in range(batch)]

    def committed(self, lens: list[int], written: int) -> None:
        """A forward wrote columns up to `written` of rows [0, len(lens)), which now hold lens entries."""
        for row, n in zip(self.rows, lens):
            row.length, row.finite = n, max(row.finite, written)

    def live_rows(self) -> list[int]:
        return [r for r, row in enumerate(self.rows) if row is not None and row.seq.finish_reason is None]

    def _move(self, target: dict[int, int], size: int, capacity: int) -> None:
        """Row r's contents to row target[r] (one gather, one scatter); a larger store first if needed."""
        grow = size > self.store.shape[2] or capacity > self.store.shape[4]
        moves = {r: n for r, n in target.items() if grow or r != n}
        old = self.store
        if grow:
            shape = list(old.shape)
            shape[2], shape[4] = size, capacity
            self.store = old.new_empty(shape)
        if moves:
            src, dst = list(moves), list(moves.values())
            cols = max(self.rows[r].finite for r in src)
            picked = old[:, :, torch.tensor(src, device=old.device), :, :cols]  # a copy: rows may overlap
            self.store[:, :, torch.tensor(dst, device=old.device), :, :cols] = picked
        rows: list[Row | None] = [None] * size
        for r, n in target.items():
            rows[n] = self.rows[r]
        self.rows = rows

    def _copy_in(self, k: int, seq) -> None:
        own = seq.cache
        n = own.length if own.store is not None else 0
        if n:
            self.store[:, :, k, :, :n] = own.store[:, :, 0, :, :n]
        self.rows[k] = Row(seq, n, own.capacity, n)
        seq.cache = None
