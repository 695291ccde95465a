"""In-process continuous batching (specdec.batch.generate_batch, the decode step the target worker runs)
with and without a drafter, on the load test's eight prompts twice, 8 sequences a step, 32 new tokens:
tokens/s, sequence steps, draft nodes verified and accepted. It separates the step itself from the served
stack (router, gRPC, the target worker's loop) when `specdec loadtest --compare` loses.

    python benchmarks/batch_ab.py [--drafter ngram] [--rounds 3]
"""
from __future__ import annotations

import argparse
import time

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.bench.machine import cpu_info
from specdec.loadtest import PROMPTS


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="ngram")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    print(cpu_info())
    prompts, params = list(PROMPTS) * 2, SamplingParams(max_new_tokens=32)
    engines = {"none": Engine.from_pretrained(drafter="none"), args.drafter: Engine.from_pretrained(drafter=args.drafter)}
    for engine in engines.values():  # warm up: kernels, caches, the policy's first steps
        generate_batch(engine, prompts[:8], params, max_batch=8, chat=True)
    for round_ in range(args.rounds):  # alternating, so a drifting machine shows as spread
        for name, engine in engines.items():
            steps: list = []
            start = time.perf_counter()
            outputs = generate_batch(engine, prompts, params, max_batch=8, chat=True, steps=steps)
            elapsed = time.perf_counter() - start
            tokens = sum(len(o) for o in outputs)
            drafted, accepted = sum(s.num_drafted for s in steps), sum(s.num_accepted for s in steps)
            print(f"round {round_} {name:8s} {tokens / elapsed:6.1f} tok/s  {elapsed:.2f} s  sequence steps "
                  f"{len(steps)}  drafted {drafted}  accepted {accepted}", flush=True)


if __name__ == "__main__":
    main()
