"""A preallocated KV store whose rows sequences keep from one batch to the next.

Under continuous batching the batch changes often (a sequence finishes, a new one is prefilled, a
sequence waits a step for its draft), and most of it stays. Restacking every sequence's cache at each
change (copy every row out, copy every row back in) cost a served target at 8 users about a seventh
of its decode loop. Here a sequence keeps its row:

    store  [layers, 2, R, kv_heads, capacity, head_dim]   R rows; a batch of B uses rows [0, B)
    seqs   [R]   the sequence in each row, or None; rows >= B hold sequences parked between steps
    lens   [R]   entries of each row in use
    finite [R]   columns [0, finite) of the row hold finite values (written, or zeroed)

A forward reads every column [0, L) of every row it steps, masked or not, so the columns a mask
hides must be finite (0 * NaN is NaN); `finite` says how far that already holds, and only the gap
past it is zeroed. A new batch costs one copy per sequence that joins, one per row moved, and one per
sequence given back (none for a sequence that finished): not two copies of every cache. A parked
sequence its owner dropped unfinished (a cancelled request) holds its row until the row is wanted.
"""
from __future__ import annotations

import torch

from specdec.models.static_cache import StaticKVCache


class RowStore:
    def __init__(self, store: torch.Tensor):
        rows = store.shape[2]
        self.store = store  # [layers, 2, R, kv_heads, capacity, head_dim]
        self.seqs: list = [None] * rows
        self.lens = [0] * rows
        self.capacities = [0] * rows  # each sequence's own capacity, for when it is given back
        self.finite = [0] * rows

    @classmethod
    def adopt(cls, store: torch.Tensor, seqs: list, lens: list[int], capacities: list[int], length: int) -> RowStore:
        """The rows of a stacked cache's store after a forward: every row finite up to `length`."""
        rows = cls(store)
        for r, seq in enumerate(seqs):
            rows.seqs[r], rows.lens[r], rows.capacities[r], rows.finite[r] = seq, lens[r], capacities[r], length
        return rows

    def backs(self, cache: StaticKVCache) -> bool:
        """Whether `cache` is still a view of this store (a forward that outgrew it got a store of its own)."""
        return cache.store is not None and cache.store.data_ptr() == self.store.data_ptr() \
            and cache.store.shape[4] == self.store.shape[4]

    def order(self, seqs: list) -> list[int]:
        """order[k]: the index in seqs of the sequence row k should hold, keeping every sequence that
        already sits in a row below len(seqs) where it is."""
        held = {id(s): r for r, s in enumerate(self.seqs) if s is not None}
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
        for r, seq in enumerate(self.seqs):  # a finished sequence is never stepped again
            if seq is not None and seq.finish_reason is not None:
                self.seqs[r], seq.cache_lender = None, None
        wanted = {id(s) for s in seqs}
        held = {id(s): r for r, s in enumerate(self.seqs) if s is not None}
        rows = max(len(self.seqs), batch)
        target = {held[id(s)]: k for k, s in enumerate(seqs) if id(s) in held}  # old row -> new row
        taken = set(target.values()) | {r for r, s in enumerate(self.seqs) if s is not None and id(s) not in wanted
                                        and r >= batch}
        spare = [r for r in range(batch, rows) if r not in taken]
        for r, seq in enumerate(self.seqs):
            if seq is None or id(seq) in wanted:
                continue
            if r >= batch:
                target[r] = r  # parked already, stays
            elif spare:
                target[r] = spare.pop(0)
            else:
                give_back(r)
                self.seqs[r] = None
        joining = [k for k, s in enumerate(seqs) if id(s) not in held]
        capacity = max([self.store.shape[4]] + [getattr(seqs[k].cache, "capacity", 0) for k in joining])
        self._move(target, rows, capacity)
        for k in joining:
            self._copy_in(k, seqs[k])
        length = max(self.lens[k] for k in range(batch))
        for k in range(batch):  # the gap a mask hides is read all the same: finite values there
            if self.finite[k] < length:
                self.store[:, :, k, :, self.finite[k]:length] = 0
                self.finite[k] = length
        cache = runner.new_cache(self.store.shape[4])
        cache.adopt(self.store[:, :, :batch], length)
        return cache, self.lens[:batch]

    def written(self, batch: int, length: int) -> None:
        """A forward wrote columns up to `length` of rows [0, batch)."""
        for k in range(batch):
            self.finite[k] = max(self.finite[k], length)

    def live_rows(self) -> list[int]:
        return [r for r, s in enumerate(self.seqs) if s is not None and s.finish_reason is None]

    def _move(self, target: dict[int, int], rows: int, capacity: int) -> None:
        """Row r's contents to row target[r] (one gather, one scatter); a larger store first if needed."""
        grow = rows > self.store.shape[2] or capacity > self.store.shape[4]
        moves = {r: n for r, n in target.items() if grow or r != n}
        old = self.store
        if grow:
            shape = list(old.shape)
            shape[2], shape[4] = rows, capacity
            self.store = old.new_empty(shape)
        if moves:
            src, dst = list(moves), list(moves.values())
            cols = max(self.finite[r] for r in src)
            picked = old[:, :, torch.tensor(src, device=old.device), :, :cols]  # a copy: rows may overlap
            self.store[:, :, torch.tensor(dst, device=old.device), :, :cols] = picked
        fields = (self.seqs, self.lens, self.capacities, self.finite)
        before = [list(f) + [None if f is self.seqs else 0] * (rows - len(f)) for f in fields]
        for f, was in zip(fields, before):
            f[:] = [None if f is self.seqs else 0] * rows
            for r, n in target.items():
                f[n] = was[r]

    def _copy_in(self, row: int, seq) -> None:
        own = seq.cache
        n = own.length if own.store is not None else 0
        if n:
            self.store[:, :, row, :, :n] = own.store[:, :, 0, :, :n]
        self.seqs[row], self.lens[row], self.capacities[row], self.finite[row] = seq, n, own.capacity, n
        seq.cache = None
