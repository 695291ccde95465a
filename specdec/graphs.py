"""Verify forwards without Python overhead on GPUs: CUDA graphs for a few padded shapes, eager otherwise.

A small model's step on a GPU is mostly kernel launches from Python (hundreds per forward). A CUDA
graph replays them in one launch, but only for fixed shapes and fixed addresses. So a graphed
forward runs at fixed width:

    batch  B -> the next of BATCH_BUCKETS      rows N -> the next of ROW_BUCKETS
    keys   the cache's whole capacity C (a power of two), entries written at [L, L + N_pad) by index
    mask   [B_pad, 1, N_pad, C]: the step's tree mask in its top-left corner; padding rows see only
           their own column (no all -inf row, no NaN)

and one `torch.cuda.CUDAGraph` is captured per (B_pad, N_pad, C, store): inputs are copied into its
static buffers, it replays, and the real rows are copied out. A graph holds its store's address, so
the stores are pooled, one per (B_pad, C): the next sequence or batch of a shape copies its entries
into the pooled store (when no live cache holds it) and replays the graphs captured over it. Without
the pool every new request and every change of the batch allocated a store at a new address and
captured its graphs again, a few eager forwards each. The price is memory: up to MAX_STORES stores stay
allocated while no cache uses them (the least recently taken free one goes first). Graphs of our own
rather than torch.compile(mode="reduce-overhead"): a capture costs a few forwards of the eager kernels,
where torch.compile first compiles each shape with inductor. The cache's store is re-homed once into
a B_pad x C store when its batch or capacity does not fit (it then stays for as long as the batch
does). Outputs are the step's real rows only; the padding's KV columns lie beyond every row's length
and are never seen.

Falls back to the ordinary eager forward, with its reason logged once: on a CPU (graphs are a CUDA
thing; there the eager path is the fast one), under tensor parallelism, with a dynamic cache, for a
shape beyond the largest bucket, or when a capture raises. A fallback changes speed,
never output: the fixed-width forward sees exactly the entries the eager one sees.
"""
from __future__ import annotations

import logging
import weakref
from collections import OrderedDict
from dataclasses import dataclass

import torch

from specdec.models.static_cache import StaticKVCache

log = logging.getLogger(__name__)
BATCH_BUCKETS = (1, 2, 4, 8, 16, 32)
ROW_BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MIN_CAPACITY = 256
MAX_GRAPHS = 64  # captured graphs kept (least recently used dropped): their memory comes from one pool
MAX_STORES = 4  # pooled KV stores kept, one per (B_pad, C) (the least recently used free one dropped)


def bucket(n: int, buckets: tuple[int, ...]) -> int | None:
    """The smallest bucket holding n (None: beyond the largest)."""
    return next((b for b in buckets if b >= n), None)


def capacity_bucket(n: int) -> int:
    return max(MIN_CAPACITY, 1 << (n - 1).bit_length())


@dataclass
class Captured:
    """One graph and the static buffers it reads and writes."""

    ids: torch.Tensor  # [B_pad, N_pad]
    positions: torch.Tensor  # [B_pad, N_pad]
    mask: torch.Tensor  # [B_pad, 1, N_pad, C]
    write: torch.Tensor  # [N_pad] the cache columns the forward fills
    graph: torch.cuda.CUDAGraph | None = None
    hidden: torch.Tensor | None = None  # [B_pad, N_pad, H] the graph's output


class GraphedDecoder:
    """runner.forward_batch through fixed-width, graph-captured forwards where possible.

    capture: False runs the fixed-width forward eagerly (what the graphs replay, checkable on a CPU)."""

    def __init__(self, runner, capture: bool = True):
        self.runner = runner
        self.capture = capture
        self.reason = why_not(runner) if capture else None  # why graphs are off (None: on)
        if self.reason:
            log.warning("CUDA graphs off: %s; verify forwards run eagerly", self.reason)
        self.pool = torch.cuda.graph_pool_handle() if capture and self.reason is None else None
        self.graphs: OrderedDict[tuple, Captured] = OrderedDict()  # (B_pad, N_pad, C, store address) -> graph
        self.shapes: set[tuple[int, int, int]] = set()  # (B_pad, N_pad, C) run so far
        # (B_pad, C) -> the pooled store [layers, 2, B_pad, kv_heads, C, head_dim] and the cache that took it last
        self.stores: OrderedDict[tuple[int, int], tuple[torch.Tensor, weakref.ref]] = OrderedDict()
        self.num_captures = 0
        self.num_stores = 0  # stores allocated (a request or batch that found its shape's store free allocates none)

    @property
    def active(self) -> bool:
        return self.reason is None

    def forward_batch(self, input_ids: torch.Tensor, cache, attn_bias: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
        """As ModelRunner.forward_batch: input_ids [B, N], attn_bias [B, 1, N, L + N], positions [B, N]
        -> hidden [B, N, H]; the cache's length moves on by N."""
        batch, rows = input_ids.shape
        b_pad, n_pad = bucket(batch, BATCH_BUCKETS), bucket(rows, ROW_BUCKETS)
        if not self.active or not isinstance(cache, StaticKVCache) or b_pad is None or n_pad is None:
            return self.runner.eager_forward_batch(input_ids, cache, attn_bias, positions)
        start = cache.length
        self._rehome(cache, b_pad, capacity_bucket(start + n_pad))
        self.shapes.add((b_pad, n_pad, cache.capacity))
        if not self.capture:
            bufs = self._buffers(b_pad, n_pad, cache.capacity)
            _fill(bufs, input_ids, positions, attn_bias, start)
            hidden = self._fixed_width(bufs, cache)
        else:
            try:
                bufs = self._graph(cache, b_pad, n_pad)
            except Exception as exc:  # noqa: BLE001 - any failure to capture: eager from now on
                self.reason = f"capturing failed ({type(exc).__name__}: {exc})"
                log.exception("CUDA graphs off: %s", self.reason)
                self.graphs.clear()
                return self.runner.eager_forward_batch(input_ids, cache, attn_bias, positions)
            _fill(bufs, input_ids, positions, attn_bias, start)
            bufs.graph.replay()
            hidden = bufs.hidden
        cache.length = start + rows
        return hidden[:batch, :rows].clone()  # a graph's output buffer is rewritten by its next replay

    def _graph(self, cache: StaticKVCache, b_pad: int, n_pad: int) -> Captured:
        """The graph for this shape over this cache's store, captured on first use."""
        key = (b_pad, n_pad, cache.capacity, cache.store.data_ptr())
        if key in self.graphs:
            self.graphs.move_to_end(key)
            return self.graphs[key]
        bufs = self._buffers(b_pad, n_pad, cache.capacity)
        own = torch.arange(n_pad, device=self.runner.device)
        bufs.write.copy_(cache.capacity - n_pad + own)  # warm-up and capture write past every row's length
        bufs.mask[:, 0, own, cache.capacity - n_pad + own] = 0.0
        stream = torch.cuda.Stream(self.runner.device)
        stream.wait_stream(torch.cuda.current_stream(self.runner.device))
        with torch.cuda.stream(stream):
            for _ in range(2):  # kernels pick their algorithms (and allocate workspaces) before capture
                self._fixed_width(bufs, cache)
        torch.cuda.current_stream(self.runner.device).wait_stream(stream)
        bufs.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(bufs.graph, pool=self.pool):
            bufs.hidden = self._fixed_width(bufs, cache)
        self.num_captures += 1
        self.graphs[key] = bufs
        while len(self.graphs) > MAX_GRAPHS:  # graphs of stores long gone
            self.graphs.popitem(last=False)
        return bufs

    def _buffers(self, b_pad: int, n_pad: int, capacity: int) -> Captured:
        device, dtype = self.runner.device, self.runner.dtype
        return Captured(torch.zeros(b_pad, n_pad, dtype=torch.long, device=device),
                        torch.zeros(b_pad, n_pad, dtype=torch.long, device=device),
                        torch.full((b_pad, 1, n_pad, capacity), torch.finfo(dtype).min, dtype=dtype, device=device),
                        torch.zeros(n_pad, dtype=torch.long, device=device))

    def _fixed_width(self, bufs: Captured, cache: StaticKVCache) -> torch.Tensor:
        cache.write_positions = bufs.write
        try:
            return self.runner.decoder(input_ids=bufs.ids, attention_mask=bufs.mask, position_ids=bufs.positions,
                                       past_key_values=cache, use_cache=True).last_hidden_state
        finally:
            cache.write_positions = None

    def _rehome(self, cache: StaticKVCache, batch: int, capacity: int) -> None:
        """Give the cache a store of exactly `batch` rows and at least `capacity` columns, a power of two
        (copying its entries): one graph per capacity, re-homed once per doubling."""
        store = cache.store
        if (store is not None and store.shape[2] == batch and cache.capacity >= capacity
                and cache.capacity == capacity_bucket(cache.capacity)):
            return
        new = self._pooled_store(cache, batch, capacity)
        if store is not None and cache.length:
            rows = min(batch, store.shape[2])
            new[:, :, :rows, :, :cache.length] = store[:, :, :rows, :, :cache.length]
        cache.adopt(new, cache.length)

    def _pooled_store(self, cache: StaticKVCache, batch: int, capacity: int) -> torch.Tensor:
        """A zeroed store [layers, 2, batch, kv_heads, capacity, head_dim] for `cache`: the pool's one of
        this shape unless another live cache still holds it (then a store of its own, unpooled).
        Zeros, because a fixed-width forward reads every column (masked; a NaN would still spread)."""
        key = (batch, capacity)
        if key not in self.stores:
            store = self._new_store(len(cache.layers), batch, capacity)
        elif self._holder(key) not in (None, cache):
            return self._new_store(len(cache.layers), batch, capacity)
        else:
            store = self.stores[key][0]
            store.zero_()
        self.stores[key] = (store, weakref.ref(cache))
        self.stores.move_to_end(key)
        self._drop_free_stores()
        return store

    def _drop_free_stores(self) -> None:
        """Beyond MAX_STORES, drop the least recently taken stores no live cache holds, with their graphs."""
        for key in list(self.stores)[:-1]:
            if len(self.stores) <= MAX_STORES:
                return
            if self._holder(key) is None:
                address = self.stores.pop(key)[0].data_ptr()
                for graph_key in [g for g in self.graphs if g[3] == address]:
                    del self.graphs[graph_key]

    def _holder(self, key: tuple[int, int]) -> StaticKVCache | None:
        """The live cache whose store the pooled one of `key` is now (None: it is free)."""
        store, taker = self.stores[key][0], self.stores[key][1]()
        return taker if taker is not None and taker.store is store else None

    def _new_store(self, num_layers: int, batch: int, capacity: int) -> torch.Tensor:
        self.num_stores += 1
        config = self.runner.config
        heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        return torch.zeros(num_layers, 2, batch, heads, capacity, head_dim, dtype=self.runner.dtype,
                           device=self.runner.device)


def _fill(bufs: Captured, input_ids: torch.Tensor, positions: torch.Tensor, attn_bias: torch.Tensor,
          start: int) -> None:
    """The step's inputs into the padded buffers: real rows top-left; padding rows (and padding
    sequences) sit at `start + row` and see only their own column."""
    batch, rows = input_ids.shape
    n_pad = bufs.ids.shape[1]
    own = torch.arange(n_pad, device=bufs.ids.device)
    bufs.ids.zero_()
    bufs.ids[:batch, :rows] = input_ids
    bufs.positions.copy_((start + own).expand_as(bufs.positions))
    bufs.positions[:batch, :rows] = positions
    bufs.mask.fill_(torch.finfo(bufs.mask.dtype).min)
    bufs.mask[:, 0, own, start + own] = 0.0
    bufs.mask[:batch, :, :rows, :start + rows] = attn_bias
    bufs.write.copy_(start + own)


def why_not(runner) -> str | None:
    """Why a runner's forwards cannot be graphed (None: they can)."""
    if runner.device.type != "cuda":
        return f"they need a CUDA device and this model is on {runner.device}"
    if runner.run_config.kv_cache != "static":
        return "they need kv_cache=static"
    if torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1:
        return "not under tensor parallelism"
    return None
