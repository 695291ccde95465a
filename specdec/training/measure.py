"""Measure trained drafters on a fixed Spec-Bench subset: tau, acceptance, tokens/s speedup over plain, same run.

    python -m specdec.training.measure --per-category 2 --max-new-tokens 96 --out specdec/checkpoints/measured.json

A method may be a label for a drafter with another checkpoint (--draft LABEL=DRAFTER:DIR), so two checkpoints of
one drafter are compared on the same questions in the same run.

Questions are evaluation data only (never training). Methods run interleaved per question so that
load changes on a shared machine hit every method alike; every drafter's greedy output is checked
against plain decoding's in the same run (lossless), and the draft model's forward cost is timed
against the target's.
"""
from __future__ import annotations

import argparse
import json
import time
from collections import defaultdict
from pathlib import Path

import torch



def forward_cost_ms(runner, num_context: int = 300, repeats: int = 10) -> float:
    """Median ms of a 1-token forward over a KV cache of num_context tokens."""
    cache = runner.new_cache()
    runner.forward(list(range(10, 10 + num_context)), cache)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        runner.forward([42], cache)
        times.append(time.perf_counter() - start)
        from specdec.core import kv

        kv.crop(cache, num_context)
    return sorted(times)[len(times) // 2] * 1e3


def main(argv: list[str] | None = None) -> int:
    from specdec import Engine, SamplingParams
    from specdec.bench.main import resolve_questions_path
    from specdec.bench.questions import DEFAULT_QUESTIONS, load_questions

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", default=DEFAULT_QUESTIONS, help="default: the vendored Spec-Bench file")
    p.add_argument("--per-category", type=int, default=1)
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--methods", default="none,draft,medusa,eagle")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--no-adaptive", action="store_true", help="always draft num_speculative_tokens deep")
    p.add_argument("--num-speculative-tokens", type=int, default=8)
    p.add_argument("--option", action="append", default=[], metavar="DRAFTER:KEY=VALUE",
                   help="a drafter option (integer), e.g. eagle3:num_nodes=60; repeatable")
    p.add_argument("--draft", action="append", default=[], metavar="LABEL=DRAFTER:DIR",
                   help="method LABEL (named in --methods) is DRAFTER with the checkpoint DIR, e.g. "
                        "medusa-new=medusa:runs/medusa; repeatable")
    p.add_argument("--out", default=None, help="JSON results file")
    args = p.parse_args(argv)
    drafts = dict(parse_draft(p, item) for item in args.draft)
    options: dict[str, dict[str, int]] = defaultdict(dict)
    for item in args.option:
        try:
            drafter, _, pair = item.partition(":")
            key, _, value = pair.partition("=")
            options[drafter][key] = int(value)
        except ValueError:
            p.error(f"--option takes DRAFTER:KEY=INTEGER, got {item!r}")
    torch.set_num_threads(args.threads)
    questions = load_questions(resolve_questions_path(args.questions), args.per_category)
    methods = args.methods.split(",")
    engines = {}
    for m in methods:
        drafter, draft = drafts.get(m, (m, None))  # a label names a drafter with its own checkpoint
        engines[m] = Engine.from_pretrained(drafter=drafter, draft=draft, adaptive=not args.no_adaptive,
                                            num_speculative_tokens=args.num_speculative_tokens, **options.get(m, {}))
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    rows: dict[tuple[str, str], dict] = defaultdict(lambda: defaultdict(float))
    mismatches = []
    for q in questions:
        reference = None
        for m in methods:
            out = engines[m].generate(q.prompt, params, chat=True)
            s = out.stats
            for key in (q.category, "all"):
                r = rows[(m, key)]
                r["tokens"] += s.num_new_tokens
                r["forwards"] += s.num_target_forwards
                r["drafted"] += s.num_draft_tokens
                r["accepted"] += s.num_accepted_tokens
                r["seconds"] += s.elapsed_s - s.prefill_s
            if reference is None:
                reference = out.token_ids
            elif out.token_ids != reference:
                mismatches.append((q.question_id, m))
            print(f"q{q.question_id} {q.category:15s} {m:7s} tau {s.tau:.2f} ({s.num_new_tokens} tokens / "
                  f"{s.num_target_forwards} forwards) tok/s {s.tokens_per_s:.1f}", flush=True)
    plain = engines[methods[0]]
    costs = {"target_forward_ms": forward_cost_ms(plain.runner)}
    if "draft" in engines:
        costs["draft_forward_ms"] = forward_cost_ms(engines["draft"].drafter.runner)
        costs["draft_over_target"] = costs["draft_forward_ms"] / costs["target_forward_ms"]
    table = []
    for (m, cat), r in rows.items():
        tps = r["tokens"] / max(r["seconds"], 1e-9)
        base = rows[(methods[0], cat)]
        table.append({"method": m, "category": cat, "tau": r["tokens"] / max(r["forwards"], 1),
                      "acceptance": r["accepted"] / r["drafted"] if r["drafted"] else 0.0, "tokens_per_s": tps,
                      "speedup": tps / (base["tokens"] / max(base["seconds"], 1e-9))})
    result = {"questions": [q.question_id for q in questions], "max_new_tokens": args.max_new_tokens,
              "adaptive": not args.no_adaptive, "num_speculative_tokens": args.num_speculative_tokens,
              "threads": args.threads, "drafter_options": options, "drafts": drafts,
              "lossless_mismatches": mismatches, "costs": costs, "table": table}
    print(json.dumps(result, indent=1))
    print(render_table(result))
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
    return 0


def parse_draft(parser: argparse.ArgumentParser, item: str) -> tuple[str, tuple[str, str]]:
    """LABEL=DRAFTER:DIR -> (LABEL, (DRAFTER, DIR))."""
    label, _, rest = item.partition("=")
    drafter, _, directory = rest.partition(":")
    if not (label and drafter and directory):
        parser.error(f"--draft takes LABEL=DRAFTER:DIR, got {item!r}")
    return label, (drafter, directory)


def render_table(result: dict) -> str:
    """Markdown: one row per drafter, tau (acceptance) per category, then overall tokens/s and speedup."""
    rows = result["table"]
    cats = [c for c in dict.fromkeys(r["category"] for r in rows) if c != "all"]
    methods = list(dict.fromkeys(r["method"] for r in rows))
    cell = {(r["method"], r["category"]): r for r in rows}
    head = "| drafter | " + " | ".join(cats) + " | all: tau | acceptance | tokens/s | speedup |"
    lines = [head, "|" + "---|" * (len(cats) + 5)]
    for m in methods:
        per_cat = [f"{cell[(m, c)]['tau']:.2f}" for c in cats]
        a = cell[(m, "all")]
        lines.append(f"| {m} | " + " | ".join(per_cat) + f" | **{a['tau']:.2f}** | {a['acceptance']:.2f} | "
                     f"{a['tokens_per_s']:.1f} | {a['speedup']:.2f}x |")
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
