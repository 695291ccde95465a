"""Microseconds per call of specdec's attention kernel in two source trees, interleaved call block by call block.

    git -C /work/main worktree add /tmp/wt-old <old commit>
    .venv/bin/python benchmarks/kernel_ab.py --trees /tmp/wt-old . --rows 8 --keys 1024 --threads 1

A kernel change worth a few percent cannot be seen in whole-forward runs on a shared VM: the same
forward moves 5-15% between minutes. Here each tree's extension (built from that tree's sources, into
the shared kernel cache) runs in a worker process of its own, and the two take turns, 50 calls a turn,
so drift hits both alike. One pair of processes is not enough either: a process's memory placement
alone moved a one-row call 13% between two workers of the same build. So several pairs run one after
the other, and each reports B / A (medians of its turns); the median of the pairs is the figure, and the
spread of the pairs says what it is worth (run the same tree twice for the noise floor: A/A).

Outputs of A and B are compared bit for bit on every query (a change to a kernel's speed must not change
its numbers; where it should, say so with --allow-different).
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm

CALLS_PER_TURN = 50


def worker(tree: str, conn, args: argparse.Namespace) -> None:
    """In the child: this tree's extension, a cache of args.keys keys (+ the new rows, causal) and 4 queries."""
    sys.path.insert(0, tree)
    import torch

    from specdec.kernels.build import load_kernel

    module = load_kernel().module
    if module is None:
        conn.send(None)
        return
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    gen = torch.Generator().manual_seed(0)
    rows, length = args.rows, args.keys + args.rows
    queries = [torch.randn(1, args.heads, rows, args.head_dim, generator=gen).to(dtype) for _ in range(4)]
    keys, values = (torch.randn(1, args.kv_heads, length, args.head_dim, generator=gen).to(dtype) for _ in range(2))
    mask = torch.zeros(1, 1, rows, length)
    mask[..., args.keys:] = torch.full((rows, rows), float("-inf")).triu(1)
    scale = args.head_dim ** -0.5
    conn.send([module.attend(q, keys, values, mask, scale) for q in queries])
    turn = 0
    while conn.recv():
        start = time.perf_counter()
        for _ in range(CALLS_PER_TURN):
            module.attend(queries[turn % 4], keys, values, mask, scale)
        conn.send((time.perf_counter() - start) / CALLS_PER_TURN)
        turn += 1


def one_pair(args: argparse.Namespace) -> tuple[float, float, bool]:
    """(A's median us per call, B's, whether every output matched bit for bit) for one pair of workers."""
    import torch

    from ab_turns import take_turns

    def built(outputs: list) -> None:
        if any(out is None for out in outputs):
            raise SystemExit("kernel_ab: a tree's extension did not build here")

    outputs, times = take_turns(worker, args, args.turns, check=built, join_timeout_s=30)
    same = all(torch.equal(a.view(torch.int16 if a.dtype == torch.bfloat16 else torch.int32),
                           b.view(torch.int16 if b.dtype == torch.bfloat16 else torch.int32))
               for a, b in zip(*outputs))
    return 1e6 * statistics.median(times[0]), 1e6 * statistics.median(times[1]), same


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs=2, required=True, metavar=("A", "B"), help="two source trees")
    parser.add_argument("--rows", type=int, default=8, help="query rows (a verify step's tree size)")
    parser.add_argument("--keys", type=int, default=1024, help="cached keys before the new rows")
    parser.add_argument("--heads", type=int, default=9)
    parser.add_argument("--kv-heads", type=int, default=3)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--pairs", type=int, default=4, help="pairs of worker processes, one after the other")
    parser.add_argument("--turns", type=int, default=120, help="turns per pair (each tree's turn: 50 calls)")
    parser.add_argument("--allow-different", action="store_true", help="B may change the outputs' bits")
    args = parser.parse_args(argv)
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the workers find this module by name
    from ab_turns import bits_verdict
    from specdec.bench.machine import machine_info

    info = machine_info()
    print(f"CPU: {info.get('cpu')}; flags: {', '.join(info.get('cpu_flags', []))}; {args.threads} thread(s); "
          f"{args.dtype}, {args.rows} rows over {args.keys} cached keys, {args.heads} heads / {args.kv_heads} kv")
    results = [one_pair(args) for _ in tqdm(range(args.pairs), desc="pairs", file=sys.stderr)]
    ratios = [b / a for a, b, _ in results]
    for (a, b, _), ratio in zip(results, ratios):
        print(f"  A {a:.2f} us  B {b:.2f} us  B/A {ratio:.3f}")
    print(f"B/A median of {len(ratios)} pairs: {statistics.median(ratios):.3f} "
          f"(pairs {min(ratios):.3f}-{max(ratios):.3f})")
    return bits_verdict([same for _, _, same in results], args.allow_different,
                        "kernel_ab: A and B gave different bits")


if __name__ == "__main__":
    sys.exit(main())
