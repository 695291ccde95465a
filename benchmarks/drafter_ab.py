"""Drafter configurations side by side in one process: tokens/s, decode-only tokens/s, tau and drafting
seconds on 12 Spec-Bench questions (two per category), on held-out training-style prompts or on the
load test's eight prompts.

    python benchmarks/drafter_ab.py --prompts spec --max-new-tokens 96 plain=none eagle3=eagle3 \
        eagle3-full=eagle3,min_path_prob:0

Each NAME=DRAFTER[,OPTION:JSON...] is one engine (options as Engine.from_pretrained takes them). Engines
run in turn over all prompts, `--rounds` times, so a drifting machine shows as round-to-round spread;
`same` says whether a round's tokens equal that engine's first round's. Compare trees by running this
script from each (PYTHONPATH=<tree>).
"""
from __future__ import annotations

import argparse
import json

from specdec import Engine, SamplingParams
from specdec.bench.machine import cpu_info
from specdec.bench.questions import CATEGORIES, DEFAULT_QUESTIONS, read_questions
from specdec.training.prompts import chat_prompts

HELD_OUT_SEED = 999  # training shards use seeds 10-59: these prompts were never trained on


def prompts_of(which: str) -> list[str]:
    if which == "train":
        return chat_prompts(seed=HELD_OUT_SEED, num_prompts=12)
    if which == "distinct":  # the load test's default: sixteen requests, none asking what another asked
        from specdec.loadtest_prompts import distinct_prompt

        return [distinct_prompt(i) for i in range(16)]
    if which == "loadtest":  # `specdec loadtest`'s eight repeated prompts, in process (no router, no gRPC)
        from specdec.loadtest import PROMPTS

        return list(PROMPTS)
    questions = read_questions(DEFAULT_QUESTIONS)
    return [q.prompt for c in CATEGORIES for q in [q for q in questions if q.category == c][1:3]]


def engine_of(spec: str) -> tuple[str, Engine]:
    name, rest = spec.split("=", 1)
    drafter, *options = rest.split(",")
    kwargs = {key: json.loads(value) for key, value in (o.split(":", 1) for o in options)}
    return name, Engine.from_pretrained(target=None, drafter=drafter, **kwargs)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", choices=("spec", "train", "loadtest", "distinct"), default="spec")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("engines", nargs="+", metavar="NAME=DRAFTER[,OPTION:JSON...]")
    args = p.parse_args()
    prompts = prompts_of(args.prompts)
    print(cpu_info())
    engines = dict(engine_of(spec) for spec in args.engines)
    for engine in engines.values():  # warm up: kernels, caches, the policy's first plain step
        engine.generate(prompts[0], SamplingParams(max_new_tokens=8), chat=True)
    first: dict[str, list] = {}
    for round_ in range(args.rounds):
        for name, engine in engines.items():
            outs = [engine.generate(prompt, SamplingParams(max_new_tokens=args.max_new_tokens), chat=True)
                    for prompt in prompts]
            tokens = sum(o.stats.num_new_tokens for o in outs)
            elapsed = sum(o.stats.elapsed_s for o in outs)
            prefill = sum(o.stats.prefill_s for o in outs)
            forwards = sum(o.stats.num_target_forwards for o in outs)
            draft_s = sum(o.stats.draft_s for o in outs)
            ids = [o.token_ids for o in outs]
            first.setdefault(name, ids)
            print(f"round {round_} {name:14s} tok/s {tokens / elapsed:6.1f} decode-only "
                  f"{tokens / (elapsed - prefill):6.1f} tau {tokens / forwards:.2f} draft_s {draft_s:.2f} "
                  f"same {first[name] == ids}", flush=True)


if __name__ == "__main__":
    main()
