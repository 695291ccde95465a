"""Microseconds per call of specdec's attention kernel alone (attention.cpp), against the query row count.

    .venv/bin/python benchmarks/attention_cost.py --threads 1
    .venv/bin/python benchmarks/attention_cost.py --threads 2 --layers 48 --repeats 300   # caches cold

SmolLM2's shape by default (9 query heads over 3 kv heads, head size 64), one sequence, a causal mask
over `cached` + rows keys, float32 and bfloat16; the fastest and the median of --repeats calls. With
--layers 1 the keys and values stay in cache between calls, so this is the kernel's arithmetic, not the
memory a forward streams; --layers N cycles call by call through N caches of the shape (48 of 1,024 keys
are ~72 MB float32, past any L3 here), so each call reads its keys and values from memory, as a forward's
layer does after megabytes of weights.
Two checkouts compare by running this in each, one after the other: the extension of each is built
from its own sources, and two builds cannot share one process. On a CPU with AMX, bf16 scores run on its
tiles; `SPECDEC_NO_AMX=1` times the vector path instead.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time

import torch

from specdec.bench.machine import machine_info
from specdec.kernels.build import load_kernel


def call_us(fn, repeats: int) -> tuple[float, float]:
    """The fastest and the median of `repeats` calls fn(i), i = 0, 1, ..., in microseconds."""
    times = []
    for i in range(repeats):
        start = time.perf_counter()
        fn(i)
        times.append(time.perf_counter() - start)
    return min(times) * 1e6, statistics.median(times) * 1e6


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--heads", type=int, default=9)
    p.add_argument("--kv-heads", type=int, default=3)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--repeats", type=int, default=40)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--layers", type=int, default=1, help="caches cycled call by call (1: one, kept warm)")
    args = p.parse_args(argv)
    if args.threads < 1 or args.repeats < 1 or args.layers < 1 or args.heads % args.kv_heads or args.head_dim % 16:
        p.error("--threads, --repeats and --layers >= 1, --heads a multiple of --kv-heads, --head-dim of 16")
    kernel = load_kernel()
    if kernel.module is None or kernel.isa == "scalar":
        p.error(f"the attention kernel needs the extension on an AVX2 or AVX-512 CPU ({kernel.reason or kernel.isa})")
    torch.set_num_threads(args.threads)
    info = machine_info()
    print(f"CPU: {info['cpu']}; flags: {', '.join(info['cpu_flags'])}; kernel {kernel.isa}; torch threads "
          f"{torch.get_num_threads()}; load average {info.get('load_average_1m')}; {args.layers} caches cycled")
    print("| dtype | cached | rows | us per call | median us | GFLOP/s |\n|---|---|---|---|---|---|")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for cached in args.contexts:
            for rows in args.rows:
                keys = cached + rows
                q = torch.randn(1, rows, args.heads, args.head_dim, generator=gen).to(dtype).transpose(1, 2)
                caches = [[torch.randn(1, args.kv_heads, keys, args.head_dim, generator=gen).to(dtype)
                           for _ in range(2)] for _ in range(args.layers)]
                mask = torch.zeros(1, 1, rows, keys)
                mask[..., cached:] = torch.full((rows, rows), float("-inf")).triu(1)
                scale = args.head_dim ** -0.5
                us, median = call_us(lambda i: kernel.module.attend(q, *caches[i % args.layers], mask, scale),
                                     args.repeats)
                flops = 4 * rows * args.heads * keys * args.head_dim  # q.k and p.v, a multiply-add each
                print(f"| {str(dtype).removeprefix('torch.')} | {cached} | {rows} | {us:.1f} | {median:.1f} "
                      f"| {flops / us / 1e3:.0f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
