"""Does the one-row forward follow the memory's rate? Sums of 1 GB and one-row forwards, interleaved.

    .venv/bin/python benchmarks/stream_vs_forward.py [--pairs 100] [--dtype float32]     # 256 cached tokens

forward_cost.py's floor is the fastest sum of its run. On a shared VM the memory can swing for minutes
between two rates (an AMD EPYC host: ~34 and ~64 GB/s), and whether the forward speeds up with it says
whether it is bound by the memory or by itself. Prints both distributions (GB/s of the weights a forward
reads) and the pairs in order.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).parent))
from forward_cost import filled_cache, runner_config, time_forward, weight_bytes  # noqa: E402

from specdec.bench.machine import machine_info  # noqa: E402
from specdec.models.embedded import embedded_target_path  # noqa: E402
from specdec.models.loader import DTYPES, load_model  # noqa: E402
from specdec.models.runner import ModelRunner  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=100)
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    args = parser.parse_args()
    torch.set_num_threads(2)
    m = machine_info()
    print(f"CPU: {m['cpu']}; flags: {', '.join(m['cpu_flags'])}; torch threads {torch.get_num_threads()}; {args.dtype}")
    runner = ModelRunner(load_model(embedded_target_path(), DTYPES[args.dtype]).model, config=runner_config("specdec"))
    num_bytes, cache = weight_bytes(runner), filled_cache(runner, 1, 256)
    data = torch.ones(1 << 28)
    sums, forwards = [], []
    for _ in range(args.pairs):
        start = time.perf_counter()
        data.sum()
        sums.append((1 << 30) / (time.perf_counter() - start) / 1e9)
        forwards.append(num_bytes / time_forward(runner, cache, 1, 256, 1) / 1e9)
    for name, rates in (("1 GB sum", sums), ("one-row forward (its weights)", forwards)):
        ordered = sorted(rates)
        print(f"{name}: fastest {ordered[-1]:.1f}, 90th percentile {ordered[int(0.9 * (len(rates) - 1))]:.1f}, "
              f"median {statistics.median(rates):.1f}, slowest {ordered[0]:.1f} GB/s")
    print("pairs in order (sum / forward GB/s):", " ".join(f"{a:.0f}/{b:.0f}" for a, b in zip(sums, forwards)))


if __name__ == "__main__":
    main()
