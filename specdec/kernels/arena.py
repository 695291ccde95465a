"""One buffer for every weight a forward streams, in the order it reads them, on 2 MB pages where the OS gives them.

A one-row forward is a read of every weight, so how fast memory hands them over is its speed. Read
from ~120 separately allocated tensors (each its own mmap of 4 KB pages) they came slower than the
same bytes from one buffer, and slower still than from one buffer on transparent huge pages: fewer
TLB misses, and the pages physically contiguous 2 MB at a time. A C loop summing SmolLM2's bf16
weights layer by layer, each of two threads its half of each (AMD EPYC, 2 cores, one process,
alternating): separate tensors 24-27 GB/s, one buffer 28-31, one buffer on huge pages 31-33 (in a
faster memory period, separate 30-31 against one buffer 38-43). Placing weights here copies their
bytes exactly, so every result is bitwise what it was.

Linux's THP in "madvise" mode (this machine's) backs a region only when asked (MADV_HUGEPAGE, before its
pages are first touched); "always" backs it anyway, "never" gives 4 KB pages and the one buffer alone.
"""
from __future__ import annotations

import logging
import mmap

import torch

log = logging.getLogger(__name__)

HUGE_PAGE = 2 << 20
ALIGN = 64  # each tensor starts on a cache line: rowgemm's tiles are read as whole lines


def buffer(num_bytes: int) -> torch.Tensor:
    """[num_bytes] uint8, starting on a 2 MB boundary, asked to be backed by huge pages where the OS
    has them (anonymous memory: never written to disk, freed with the last tensor viewing it)."""
    if not hasattr(mmap, "MAP_ANONYMOUS"):  # not a POSIX system: one buffer of the allocator's pages
        return _aligned(torch.empty(num_bytes + HUGE_PAGE, dtype=torch.uint8), num_bytes)
    region = mmap.mmap(-1, num_bytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    advice = getattr(mmap, "MADV_HUGEPAGE", None)
    if advice is not None:
        try:
            region.madvise(advice)
        except OSError as exc:  # a kernel without THP: one buffer all the same
            log.debug("huge pages not granted: %s", exc)
    return _aligned(torch.frombuffer(region, dtype=torch.uint8), num_bytes)  # keeps the mapping alive with its views


def _aligned(whole: torch.Tensor, num_bytes: int) -> torch.Tensor:
    """num_bytes of `whole` from its first 2 MB boundary (whole holds at least num_bytes + HUGE_PAGE)."""
    start = -whole.data_ptr() % HUGE_PAGE
    return whole[start:start + num_bytes]


def place(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Copies of `tensors` (same shapes, dtypes and values, contiguous), one after another in one buffer,
    each on a cache-line boundary, in the order given (the order a forward reads them)."""
    offsets, total = [], 0
    for t in tensors:
        total = -(-total // ALIGN) * ALIGN
        offsets.append(total)
        total += t.nbytes
    memory = buffer(max(total, 1))
    placed = []
    for t, at in zip(tensors, offsets):
        view = memory[at:at + t.nbytes].view(t.dtype).view(t.shape)
        view.copy_(t)
        placed.append(view)
    return placed


def place_packed(linears: list) -> None:
    """The packed weights of these PackedLinear modules (specdec.kernels.linear) in one buffer, in the order
    given. A packed weight is whole 128-byte tile rows, so consecutive ones lie back to back (the lean walk
    then views q|k|v and gate|up as one weight each, without a copy)."""
    for module, packed in zip(linears, place([m.packed for m in linears])):
        module.packed = packed
