"""Plain decoding tokens/s of source trees side by side (this one against an older commit's worktree).

    git -C /work/main worktree add /tmp/wt-old <old commit>
    .venv/bin/python benchmarks/decode_speed.py --trees /tmp/wt-old . --configs float32:torch float32:auto bfloat16:auto

Each (tree, dtype, kernel) runs in its own process with PYTHONPATH at that tree, so the older code is
what runs; rounds alternate between them (ABAB...) so drift on a shared machine hits all alike.
A round: greedy plain decoding (no drafter) of the prompts, 64 new tokens each, after one warm-up
generation; tokens/s over the decode loop and prefill together, as GenerationStats reports it.
Prints the best and the median of the rounds, the CPU and its flags, and the token ids' agreement.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

PROMPTS = ["Write a Python function that returns the square of a number.",
           "Explain in three sentences why the sky is blue.",
           'Repeat the following JSON exactly: {"name": "Ada", "age": 36, "city": "London"}']

NO_OPTION = "this tree has no linear_kernel option: use the kernel 'torch'"


def one_round(dtype: str, kernel: str, max_new_tokens: int) -> dict:
    """In the child: load, warm up, decode the prompts; tokens/s and the token ids."""
    import inspect
    import time

    from specdec import Engine, SamplingParams

    options = {"linear_kernel": kernel} if "linear_kernel" in inspect.signature(Engine.from_pretrained).parameters \
        else {}
    if kernel != "torch" and not options:
        raise SystemExit(NO_OPTION)
    engine = Engine.from_pretrained(drafter="none", dtype=dtype, **options)
    params = SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True)
    engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=8), chat=True)
    tokens, ids, start = 0, [], time.perf_counter()
    for prompt in PROMPTS:
        out = engine.generate(prompt, params, chat=True)
        tokens += len(out.token_ids)
        ids.append(out.token_ids)
    return {"tokens_per_s": tokens / (time.perf_counter() - start), "token_ids": ids}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs="+", default=["."], help="source trees (worktrees) to compare")
    p.add_argument("--configs", nargs="+", default=["float32:torch", "float32:auto"],
                   help="dtype:linear_kernel pairs (a tree without the option runs only kernel 'torch')")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--threads", type=int, default=0, help="torch threads in each child (0 = torch's default)")
    p.add_argument("--child", nargs=2, metavar=("DTYPE", "KERNEL"), help=argparse.SUPPRESS)
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.child:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        print(json.dumps(one_round(*args.child, args.max_new_tokens)))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from specdec.bench.machine import cpu_info

    info = cpu_info()
    print(f"CPU: {info['cpu']}; flags: {', '.join(info['cpu_flags'])}", flush=True)
    # every tree runs every config it has the option for (a tree without linear_kernel: 'torch' only)
    runs = [(tree, *config.split(":")) for tree in args.trees for config in args.configs]
    speeds: dict = {run: [] for run in runs}
    ids: dict = {}
    for round_index in range(args.rounds):
        for tree, dtype, kernel in list(runs):
            env = {**os.environ, "PYTHONPATH": str(Path(tree).resolve()), "HF_HUB_OFFLINE": "1"}
            out = subprocess.run([sys.executable, __file__, "--child", dtype, kernel, "--max-new-tokens",
                                  str(args.max_new_tokens), "--threads", str(args.threads)],
                                 env=env, capture_output=True, text=True, cwd=tree)
            if out.returncode != 0 and NO_OPTION in out.stderr:
                runs.remove((tree, dtype, kernel))
                del speeds[(tree, dtype, kernel)]
                continue
            if out.returncode != 0:
                raise SystemExit(f"{tree} {dtype} {kernel} failed:\n{out.stderr[-2000:]}")
            result = json.loads(out.stdout.strip().splitlines()[-1])
            speeds[(tree, dtype, kernel)].append(result["tokens_per_s"])
            ids[(tree, dtype, kernel)] = result["token_ids"]
            print(f"round {round_index + 1}: {tree} {dtype} {kernel}: {result['tokens_per_s']:.1f} tok/s", flush=True)
    base = max(speeds[runs[0]])
    rows = []
    for run, values in speeds.items():
        same = ids[run] == ids[runs[0]]
        rows.append({"tree": run[0], "dtype": run[1], "kernel": run[2], "best_tok_s": round(max(values), 1),
                     "median_tok_s": round(statistics.median(values), 1), "vs_first": round(max(values) / base, 2),
                     "same_tokens_as_first": same})
        print(f"{run[0]} {run[1]} {run[2]}: best {max(values):.1f} tok/s, median {statistics.median(values):.1f}, "
              f"{max(values) / base:.2f}x the first; tokens {'equal to' if same else 'differ from'} the first's")
    if args.json:
        Path(args.json).write_text(json.dumps({"cpu": info, "rounds": args.rounds, "runs": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
