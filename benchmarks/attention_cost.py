"""specdec's attention kernel alone: milliseconds for 30 layers' calls (SmolLM2's shape: 9 query heads,
3 kv heads, head dim 64) against query rows and cached keys, float32 and bfloat16.

    python benchmarks/attention_cost.py [--threads 2]
    SPECDEC_NO_AMX=1 python benchmarks/attention_cost.py   # bf16 scores on vector code, not AMX tiles
"""
from __future__ import annotations

import argparse
import time

import torch

from specdec.bench.machine import cpu_info
from specdec.kernels.build import load_kernel

LAYERS, HEADS, KV_HEADS, DIM = 30, 9, 3, 64


def best_ms(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e3


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kernel = load_kernel()
    if kernel.module is None:
        raise SystemExit(f"error: the kernels did not build: {kernel.reason}")
    print(cpu_info(), f"kernel isa {kernel.isa}, {args.threads} threads")
    gen = torch.Generator().manual_seed(0)
    for dtype in (torch.float32, torch.bfloat16):
        for keys in (256, 1024):
            k, v = (torch.randn(1, KV_HEADS, keys, DIM, generator=gen).to(dtype) for _ in range(2))
            cells = []
            for rows in (1, 8, 16):
                q = torch.randn(1, HEADS, rows, DIM, generator=gen).to(dtype)
                ms = best_ms(lambda: [kernel.module.attend(q, k, v, None, DIM ** -0.5) for _ in range(LAYERS)],
                             args.repeats)
                cells.append(f"{rows} rows {ms:.2f} ms")
            print(f"{str(dtype).removeprefix('torch.')}, {keys} keys: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
