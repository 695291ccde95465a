"""In-process continuous batching (specdec.batch.generate_batch, the decode step the target worker runs)
with and without a drafter, on the load test's eight prompts twice (or, --mix, two of each workload of
benchmarks/workloads: code, JSON, quoting answers, agent loops, summaries, stories), 8 sequences a step:
tokens/s, sequence steps, draft nodes verified and accepted. It separates the step itself from the served
stack (router, gRPC, the target worker's loop) when `specdec loadtest --compare` loses. --padded adds the
drafter with padded verify forwards (RunnerConfig.ragged off: every tree cut to one node count) beside
the ragged ones, so the two can be compared in one run.

    python benchmarks/batch_ab.py [--drafter ngram] [--rounds 3] [--mix] [--padded] [--dtype bfloat16]
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import time
from pathlib import Path

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.bench.machine import cpu_info
from specdec.loadtest import PROMPTS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="ngram")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--mix", action="store_true", help="two prompts of each workload instead of the load test's")
    p.add_argument("--padded", action="store_true", help="also the drafter with padded verify forwards")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--max-new-tokens", type=int, default=32)
    args = p.parse_args()
    print(cpu_info())
    prompts = mixed_prompts() if args.mix else list(PROMPTS) * 2
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    engines = {"none": Engine.from_pretrained(drafter="none", dtype=args.dtype),
               args.drafter: Engine.from_pretrained(drafter=args.drafter, dtype=args.dtype)}
    if args.padded:
        padded = Engine.from_pretrained(drafter=args.drafter, dtype=args.dtype)
        padded.runner.run_config = dataclasses.replace(padded.runner.run_config, ragged=False)
        engines[f"{args.drafter}-padded"] = padded
    for engine in engines.values():  # warm up: kernels, caches, the policy's first steps
        generate_batch(engine, prompts[:8], params, max_batch=8, chat=True)
    for round_ in range(args.rounds):  # alternating, so a drifting machine shows as spread
        for name, engine in engines.items():
            if hasattr(engine.drafter, "reset"):  # no answer remembered from an earlier round (suffix, hybrid)
                engine.drafter.reset()
            steps: list = []
            start = time.perf_counter()
            outputs = generate_batch(engine, prompts, params, max_batch=8, chat=True, steps=steps)
            elapsed = time.perf_counter() - start
            tokens = sum(len(o) for o in outputs)
            drafted, accepted = sum(s.num_drafted for s in steps), sum(s.num_accepted for s in steps)
            print(f"round {round_} {name:8s} {tokens / elapsed:6.1f} tok/s  {elapsed:.2f} s  sequence steps "
                  f"{len(steps)}  drafted {drafted}  accepted {accepted}", flush=True)


def mixed_prompts(per_workload: int = 2) -> list:
    """The first `per_workload` prompts of each workload file, as chat messages, workloads interleaved
    (a batch holds every kind at once)."""
    files = sorted(Path(__file__).with_name("workloads").glob("*.jsonl"))
    kinds = [[json.loads(line)["messages"] for line in f.read_text().splitlines()[:per_workload]] for f in files]
    return [kind[i] for i in range(per_workload) for kind in kinds]


if __name__ == "__main__":
    main()
