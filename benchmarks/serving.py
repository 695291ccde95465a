"""Tokens/s through the gRPC stack (router -> draft worker -> target worker, separate processes)
against the in-process engine on the same prompts, with the draft worker's pipelining on and off.

    .venv/bin/python benchmarks/serving.py                      # embedded SmolLM2, ngram + draft model
    .venv/bin/python benchmarks/serving.py --drafters draft --draft PATH --max-new-tokens 96

Greedy, one stream at a time. The three configurations run interleaved (prompt by prompt, round by
round) so that load from other processes on a shared machine hits them alike; ratios within one run
are the figures that count.
Each configuration is checked to produce the same tokens as in process, so speed is never bought
with a different output.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specdec.core.types import SamplingParams  # noqa: E402
from specdec.launch import start_stack  # noqa: E402
from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat this list exactly, then add one more fruit: apple, banana, cherry, date, elderberry, fig.",
    "Explain in three sentences why the sky is blue.",
    "Translate to French: The cat sits on the mat and looks at the garden.",
]


@dataclass
class Tally:
    """One configuration's totals over every prompt and round."""

    name: str
    num_tokens: int = 0
    elapsed_s: float = 0.0
    num_forwards: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    token_ids: list = field(default_factory=list)

    def add(self, out, elapsed_s: float) -> None:
        self.num_tokens += len(out.token_ids)
        self.elapsed_s += elapsed_s
        self.num_forwards += out.stats.num_target_forwards
        self.num_drafted += out.stats.num_draft_tokens
        self.num_accepted += out.stats.num_accepted_tokens
        self.token_ids.append(list(out.token_ids))

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.elapsed_s

    def row(self, baseline: "Tally") -> dict:
        return {"config": self.name, "tokens_per_s": round(self.tokens_per_s, 2),
                "vs_in_process": round(self.tokens_per_s / baseline.tokens_per_s, 3),
                "tau": round(self.num_tokens / self.num_forwards, 2),
                "acceptance": round(self.num_accepted / max(self.num_drafted, 1), 3),
                "same_tokens": self.token_ids == baseline.token_ids}


def engine_generate(args, drafter: str):
    import torch

    from specdec.engine import Engine

    if args.threads:
        torch.set_num_threads(args.threads)
    engine = Engine.from_pretrained(args.target, drafter=drafter, draft=args.draft if drafter == "draft" else None,
                                    dtype=args.dtype, num_speculative_tokens=args.k)
    return lambda prompt, params: engine.generate(prompt, params, chat=True)


def stack_config(args, drafter: str, pipeline: bool) -> StackConfig:
    return StackConfig(
        router=RouterConfig(),
        targets=(TargetConfig(model=args.target, dtype=args.dtype, num_threads=args.threads),),
        drafts=(DraftConfig(drafter=drafter, model=args.draft if drafter == "draft" else None,
                            target_model=args.target, dtype=args.dtype, num_speculative_tokens=args.k,
                            pipeline=pipeline, num_threads=args.draft_threads),))


def measure(args, drafter: str, prompts, params) -> list[Tally]:
    """In process, gRPC with pipelining, gRPC without, interleaved prompt by prompt and round by round,
    so that load from other processes on a shared machine hits all three alike."""
    from specdec.client import Client

    stacks = []
    try:
        for pipeline in (True, False):
            stacks.append(start_stack(stack_config(args, drafter, pipeline)))
        clients = [Client(stack.address) for stack in stacks]
        runs = {f"{drafter} in-process": engine_generate(args, drafter)}
        for pipeline, client in zip(("on", "off"), clients):
            runs[f"{drafter} gRPC pipeline {pipeline}"] = (
                lambda prompt, p, client=client: client.generate(prompt, p, chat=True, timeout_s=600))
        tallies = {name: Tally(name) for name in runs}
        for run in runs.values():
            run(prompts[0], SamplingParams(max_new_tokens=8))  # warm-up: first-call allocations, connections
        for _ in range(args.rounds):
            for prompt in prompts:
                for name, run in runs.items():
                    start = time.perf_counter()
                    out = run(prompt, params)
                    tallies[name].add(out, time.perf_counter() - start)
        return list(tallies.values())
    finally:
        for stack in stacks:
            stack.stop()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="target dir (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--draft", default=None, help="draft model dir (default: the random stand-in)")
    parser.add_argument("--drafters", default="ngram,draft")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--k", type=int, default=8, help="num_speculative_tokens")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    parser.add_argument("--threads", type=int, default=1, help="torch threads of the target and the in-process engine "
                        "(1: on a shared 2-core machine OpenMP spin-waits cost 5-7x; 0 = torch default)")
    parser.add_argument("--draft-threads", type=int, default=1, help="torch threads of the draft worker")
    parser.add_argument("--rounds", type=int, default=2, help="passes over the prompts")
    parser.add_argument("--json-out", default=None)
    args = parser.parse_args()
    prompts, params = PROMPTS[:args.num_prompts], SamplingParams(max_new_tokens=args.max_new_tokens)
    rows = []
    for drafter in args.drafters.split(","):
        tallies = measure(args, drafter, prompts, params)
        for tally in tallies:
            rows.append(tally.row(tallies[0]))
            print(json.dumps(rows[-1]), flush=True)
    print(f"\n{'config':<28} {'tok/s':>7} {'vs in-proc':>10} {'tau':>5} {'accept':>7} same")
    for r in rows:
        print(f"{r['config']:<28} {r['tokens_per_s']:>7.2f} {r['vs_in_process']:>10.3f} {r['tau']:>5.2f} "
              f"{r['acceptance']:>7.3f} {r['same_tokens']}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(rows, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
