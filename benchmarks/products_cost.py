"""specdec's rowgemm alone: every linear layer of SmolLM2 (30 layers' q|k|v, o, gate|up, down) and its LM head,
one call each, per row count and rowgemm path, in one process (so paths compare on the same memory).

    python benchmarks/products_cost.py --dtype bfloat16     # AVX512-BF16 (isa 3) against AMX tiles (isa 4)
    python benchmarks/products_cost.py --dtype float32      # AVX2 (1) against AVX-512 (2)
"""
from __future__ import annotations

import argparse

import torch
from attention_cost import call_us  # beside this script in benchmarks/

from specdec.bench.machine import cpu_info
from specdec.kernels.build import ISA_NAMES, load_kernel
from specdec.kernels.packing import pack

SHAPES = [(576 + 2 * 192, 576), (576, 576), (2 * 1536, 576), (576, 1536)] * 30 + [(49152, 576)]  # [out, in]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("float32", "bfloat16"), default="bfloat16")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    kernel = load_kernel()
    if kernel.module is None:
        raise SystemExit(f"error: the kernels did not build: {kernel.reason}")
    dtype = getattr(torch, args.dtype)
    best = ISA_NAMES.index(kernel.isa)
    isas = [i for i in ((3, 4) if dtype == torch.bfloat16 else (1, 2)) if i <= best]
    print(cpu_info(), f"{args.threads} threads, paths {[ISA_NAMES[i] for i in isas]}")
    weights = [pack(torch.randn(n, k).to(dtype)) for n, k in SHAPES]
    num_bytes = sum(w.numel() * w.element_size() for w in weights)
    for rows in (1, 2, 4, 8, 16, 32):
        xs = {k: torch.randn(rows, k).to(dtype) for k in (576, 1536)}
        cells = []
        for isa in isas:
            def products() -> None:
                for (n, k), w in zip(SHAPES, weights):
                    kernel.module.rowgemm(xs[k], w, n, isa, False)
            products()  # warm: the first call of a path faults its pages in
            ms = call_us(lambda _: products(), args.repeats)[0] / 1e3
            cells.append(f"{ISA_NAMES[isa]} {ms:.2f} ms ({num_bytes / ms / 1e6:.1f} GB/s)")
        print(f"{rows:2d} rows: " + ", ".join(cells), flush=True)


if __name__ == "__main__":
    main()
