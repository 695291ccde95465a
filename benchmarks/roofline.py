"""This machine's two roofs for a target forward: the memory stream and the vector units' arithmetic.

    .venv/bin/python benchmarks/roofline.py      # CPU flags, both roofs, and the rows where they cross

A forward over r rows per sequence must read every weight once (bytes / stream rate) and do 2 FLOP per
weight per row plus attention's (FLOP / arithmetic peak); it costs at least the larger of the two. One
row is far below the arithmetic roof, so its floor is the stream; the row count where the two meet is
how many rows a forward can verify for the price of one, on this machine, with any kernel. The peak is
specdec's register-only loop of the instruction rowgemm's products run on (specdec/kernels/peak.cpp:
bf16 dot-pairs on AVX512-BF16, float32 FMAs otherwise) on every torch thread. On a CPU whose bf16
products run on AMX tiles the vector peak is not their roof, and no bf16 compute floor is drawn.
benchmarks/forward_cost.py prints the compute floor of every forward it times beside its bandwidth floor.
"""
from __future__ import annotations

import sys

import torch

from specdec.bench.machine import cpu_info
from specdec.kernels.build import load_kernel

PEAK_ITERS = 4_000_000  # ~12 ms of one core at 3.5 GHz per sample


def arith_peak_gflops(dtype: torch.dtype, samples: int = 5) -> float | None:
    """The fastest of `samples` register-only runs on torch's threads (the first wakes the pool), or
    None where the kernels did not build or bf16 products run on AMX tiles."""
    kernel = load_kernel()
    if kernel.module is None or (dtype == torch.bfloat16 and kernel.isa == "amx_bf16"):
        return None
    bf16 = dtype == torch.bfloat16
    return max(kernel.module.arith_peak(bf16, PEAK_ITERS) for _ in range(samples))


def forward_flops(config, num_weights: int, batch: int, rows: int, context: int) -> float:
    """FLOP of one forward over `rows` new tokens per sequence after `context` cached ones: 2 per weight
    per row (every linear layer and the LM head over every row), and attention's q.k and p.v over the
    cached keys and the new ones (2 FLOP per multiply-add, the causal half of the new block counted whole)."""
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    attention = 4 * config.num_hidden_layers * config.num_attention_heads * head_dim * (context + rows)
    return float(batch * rows * (2 * num_weights + attention))


def crossover_rows(bytes_per_weight: int, stream_gbs: float, peak_gflops: float) -> float:
    """Rows at which a forward's products take as long to compute as its weights take to stream
    (attention left out): 2 FLOP per weight per row against bytes_per_weight per weight."""
    return peak_gflops / stream_gbs * bytes_per_weight / 2


def main() -> int:
    sys.path.insert(0, str(__import__("pathlib").Path(__file__).parent))
    from forward_cost import stream_samples_gbs  # beside this script

    info = cpu_info()
    print(f"CPU: {info['cpu']}; flags: {', '.join(info['cpu_flags'])}; torch threads {torch.get_num_threads()}")
    samples = stream_samples_gbs(repeats=9)
    fast, median = max(samples), sorted(samples)[len(samples) // 2]
    print(f"memory stream: fastest {fast:.1f} GB/s, median {median:.1f} GB/s (9 sums of 1 GB)")
    for dtype, width in ((torch.float32, 4), (torch.bfloat16, 2)):
        peak = arith_peak_gflops(dtype)
        if peak is None:
            print(f"{dtype}: no vector compute roof here (kernels absent, or bf16 on AMX tiles)")
            continue
        print(f"{dtype}: arithmetic peak {peak:.0f} GFLOP/s; the roofs cross at "
              f"{crossover_rows(width, fast, peak):.1f} rows (fastest stream) / "
              f"{crossover_rows(width, median, peak):.1f} rows (median stream)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
