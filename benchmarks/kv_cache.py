"""Static (preallocated) against dynamic (concatenated) KV cache: a decode loop timed both ways.

    .venv/bin/python benchmarks/kv_cache.py                      # SmolLM2, float32, this machine's threads
    .venv/bin/python benchmarks/kv_cache.py --target DIR --json out.json

Each case prefills its sequences (untimed), then times the decode loop alone (specdec.step.decode_step
until every sequence has its tokens): plain greedy decoding of one sequence, prompt lookup on one
sequence, and plain decoding of a batch of 4. The two kinds alternate in ABBA order `--repeats` times,
so drift on a shared machine hits both alike; reported are the fastest and the median milliseconds per
generated token, and dynamic / static of the fastest. Token ids must agree (exit 1 if not).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from specdec.batch_cache import BatchCache
from specdec.bench.machine import machine_info, versions
from specdec.core.types import SamplingParams
from specdec.drafters import build_drafter
from specdec.engine import Engine, EngineConfig
from specdec.models.loader import load_model, pick_dtype
from specdec.models.runner import RunnerConfig
from specdec.sequence import Sequence
from specdec.step import Drafting, decode_step

PROMPT = ("Here is a list of fruits: apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, "
          "mango, nectarine, orange, papaya, quince. " * 5 + "Write the list again, one per line, numbered.")


def decode_loop(engine: Engine, prompts: list[list[int]], params: SamplingParams) -> tuple[float, list[list[int]]]:
    """(seconds of the decode loop, tokens per sequence); prefill happens before the clock starts."""
    policy, pool = engine.new_policy(load_aware=False), BatchCache(engine.runner)
    entries = []
    for i, prompt in enumerate(prompts):
        seq = Sequence(engine.runner, prompt, params, engine.tokenizer, engine.eos_ids)
        session = engine.drafter.new_session() if engine.drafter is not None else None
        entries.append(Drafting(str(i), seq, session))
        policy.add(str(i))
    start = time.perf_counter()
    active = list(entries)
    while active:
        decode_step(engine.runner, policy, pool, active, engine.max_len)
        active = [e for e in active if e.seq.finish_reason is None]
    return time.perf_counter() - start, [list(e.seq.generated_ids) for e in entries]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default=None)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--repeats", type=int, default=4)
    parser.add_argument("--json", default=None, help="also write the figures here")
    args = parser.parse_args(argv)
    dtype = pick_dtype(args.dtype)
    target = load_model(args.target, dtype)
    engines = {}
    for kind in ("static", "dynamic"):
        config = EngineConfig(adaptive=False, runner=RunnerConfig(kv_cache=kind))
        engines[kind] = {"plain": Engine(target, None, config),
                         "ngram": Engine(target, build_drafter("ngram", target, None, {}, dtype), config)}
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    prompt_ids = engines["static"]["plain"].encode(PROMPT)
    cases = {"plain, 1 sequence": ("plain", [prompt_ids]), "prompt lookup, 1 sequence": ("ngram", [prompt_ids]),
             "plain, batch of 4": ("plain", [prompt_ids[i:] for i in range(4)])}
    rows, same = [], True
    for name, (method, prompts) in cases.items():
        times = {kind: [] for kind in engines}
        outputs = {}
        for repeat in range(args.repeats):
            order = ("static", "dynamic") if repeat % 2 == 0 else ("dynamic", "static")  # ABBA
            for kind in order:
                seconds, outputs[kind] = decode_loop(engines[kind][method], prompts, params)
                times[kind].append(seconds)
        same &= outputs["static"] == outputs["dynamic"]
        num_tokens = sum(len(t) for t in outputs["static"])
        best = {kind: 1000 * min(t) / num_tokens for kind, t in times.items()}
        median = {kind: 1000 * statistics.median(t) / num_tokens for kind, t in times.items()}
        rows.append({"case": name, "static_ms_per_token": round(best["static"], 2),
                     "dynamic_ms_per_token": round(best["dynamic"], 2),
                     "static_median_ms_per_token": round(median["static"], 2),
                     "dynamic_median_ms_per_token": round(median["dynamic"], 2),
                     "dynamic_over_static": round(best["dynamic"] / best["static"], 3)})
    print(f"{'case':28} {'static ms/tok (median)':>23} {'dynamic ms/tok (median)':>24} {'dynamic/static':>15}")
    for r in rows:
        print(f"{r['case']:28} {r['static_ms_per_token']:10.2f} ({r['static_median_ms_per_token']:8.2f})   "
              f"{r['dynamic_ms_per_token']:10.2f} ({r['dynamic_median_ms_per_token']:8.2f})   "
              f"{r['dynamic_over_static']:15.3f}")
    info = {"machine": machine_info(), "versions": versions(Path(__file__).resolve().parent.parent),
            "dtype": args.dtype, "prompt_tokens": len(prompt_ids), "max_new_tokens": args.max_new_tokens,
            "repeats": args.repeats, "threads": torch.get_num_threads(), "rows": rows, "same_tokens": same}
    print(f"cpu: {info['machine']['cpu']} flags {','.join(info['machine']['cpu_flags'])}; threads {info['threads']}; "
          f"prompt {len(prompt_ids)} tokens; identical tokens: {same}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(info, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
