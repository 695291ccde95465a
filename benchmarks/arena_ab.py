"""Forwards with the weights in one buffer (specdec.kernels.arena) against the same weights as separate tensors.

    .venv/bin/python benchmarks/arena_ab.py --dtype bfloat16 --rows 1 8 16 --forwards 150

Two runners of the embedded model in one process, one built with arena.place bypassed (each weight a
tensor of its own, as before), their forwards alternating (which goes first alternates too), 256 cached tokens,
batch 1, the LM head over every row: the same bytes and the same bits, only their layout differs.
Prints the median and fastest ms per forward of each, with the CPU's flags and the huge pages held.
"""
from __future__ import annotations

import argparse
import statistics
import sys

from forward_cost import filled_cache, runner_config, time_forward  # beside this script in benchmarks/
from specdec.bench.machine import cpu_info
from specdec.kernels import arena
from specdec.models.loader import DTYPES, load_model
from specdec.models.runner import ModelRunner


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=sorted(DTYPES), default="bfloat16")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--forwards", type=int, default=150, help="forwards of each layout per row count")
    args = p.parse_args(argv)
    info = cpu_info()
    print(f"CPU: {info['cpu']}; flags: {', '.join(info['cpu_flags'])}")
    place, runners = arena.place, {}
    try:
        for name in ("separate", "one buffer"):
            arena.place = place if name == "one buffer" else (lambda tensors: [t.clone() for t in tensors])
            runners[name] = ModelRunner(load_model(None, DTYPES[args.dtype]).model, config=runner_config("specdec"))
    finally:
        arena.place = place
    huge = [line.split()[1] for line in open("/proc/self/smaps_rollup") if line.startswith("AnonHugePages")]
    print(f"huge pages held: {huge[0] if huge else '?'} kB")
    caches = {name: filled_cache(runner, 1, 256) for name, runner in runners.items()}
    for rows in args.rows:
        ms = {name: [] for name in runners}
        for i in range(args.forwards):
            for name in (list(runners) if i % 2 else list(runners)[::-1]):
                ms[name].append(1e3 * time_forward(runners[name], caches[name], 1, 256, rows))
        print(f"{args.dtype} {rows} rows: " + ", ".join(
            f"{name} median {statistics.median(v):.2f} fastest {min(v):.2f} ms" for name, v in ms.items()), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
