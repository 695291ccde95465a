"""Flip rate: how often greedy speculative output differs from plain decoding, and at which logit gap.

Greedy speculative decoding equals plain decoding in exact arithmetic. In floating point a one-token
decode step and a many-row verify forward sum in different orders, so where the target's two best
logits are nearly tied the argmax can come out differently. This script measures how often that
happens on Spec-Bench questions: for each drafter and dtype, the share of questions whose
speculative output differs from plain decoding with the same target, dtype and machine; and, at the
first differing position, the gap between the target's two largest logits there (from one plain
forward over prompt + common prefix), which shows whether a flip is a near-tie.

    python benchmarks/flip_rate.py --per-category 3 --dtypes float32
    python benchmarks/flip_rate.py --per-category 1 --dtypes bfloat16 --max-new-tokens 64
    python benchmarks/flip_rate.py --render benchmarks/results/flip_rate_*.json   # one table of both

Writes <out>.json (every generation) and <out>.md (the table). The adaptive controller follows
measured times, so which trees get verified, and so which flips occur, can vary from run to run.
"""
from __future__ import annotations

import argparse
import json
import platform
import re
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

DRAFTERS = ("ngram", "draft", "medusa", "eagle")
DEFAULT_QUESTIONS = "benchmarks/spec_bench/question.jsonl"


@dataclass(frozen=True)
class Flip:
    """The first position where speculative and plain greedy output part, with the target's margin there."""

    position: int  # index into the generated tokens
    plain_token: int
    spec_token: int
    top2_gap: float  # target logit of its best token minus its second best, at that position
    spec_token_rank: int  # tokens with a strictly larger logit in the plain forward: 0 = (tied) argmax


@dataclass(frozen=True)
class Record:
    dtype: str
    drafter: str
    question_id: int
    category: str
    num_plain_tokens: int
    num_spec_tokens: int
    tau: float
    flip: Flip | None


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", default=DEFAULT_QUESTIONS, help="Spec-Bench question.jsonl")
    p.add_argument("--per-category", type=int, default=10, help="questions per Spec-Bench category")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--dtypes", default="float32,bfloat16", help="comma-separated: float32, bfloat16, float16")
    p.add_argument("--drafters", default=",".join(DRAFTERS), help="comma-separated: " + ", ".join(DRAFTERS))
    p.add_argument("--target", default=None, help="target checkpoint dir (default: the embedded SmolLM2)")
    p.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    p.add_argument("--out", default=None, help="output path without suffix (default: "
                   "benchmarks/results/flip_rate_<dtypes>)")
    p.add_argument("--render", nargs="+", default=None, metavar="JSON",
                   help="run nothing: merge these result files into one table at --out")
    args = p.parse_args(argv)
    args.dtypes = tuple(d for d in args.dtypes.split(",") if d)
    args.drafters = tuple(d for d in args.drafters.split(",") if d)
    unknown = set(args.drafters) - set(DRAFTERS)
    if unknown or not args.drafters:
        p.error(f"--drafters must name some of {', '.join(DRAFTERS)}, got {','.join(args.drafters)!r}")
    if args.per_category < 1 or args.max_new_tokens < 1:
        p.error("--per-category and --max-new-tokens must be >= 1")
    args.out = args.out or ("benchmarks/results/flip_rate" if args.render else
                            f"benchmarks/results/flip_rate_{'_'.join(args.dtypes)}")
    return args


def first_flip(model, prompt_ids: list[int], plain: list[int], spec: list[int]) -> Flip | None:
    """None when the outputs agree; else where they part and the target's top-2 logit gap there."""
    import torch

    position = next((i for i, (a, b) in enumerate(zip(plain, spec)) if a != b), None)
    if position is None:
        if len(plain) == len(spec):
            return None
        position = min(len(plain), len(spec))  # one stopped (EOS) where the other went on
    longer = plain if len(plain) > len(spec) else spec
    with torch.inference_mode():
        ids = torch.tensor([prompt_ids + plain[:position]])
        logits = model(input_ids=ids).logits[0, -1].float()  # [vocab]
    top2 = torch.topk(logits, 2).values
    spec_token = spec[position] if position < len(spec) else -1
    plain_token = plain[position] if position < len(plain) else -1
    chosen = spec_token if spec_token >= 0 else longer[position]
    rank = int((logits > logits[chosen]).sum())
    return Flip(position, plain_token, spec_token, float(top2[0] - top2[1]), rank)


def run(args: argparse.Namespace) -> dict:
    import torch
    from tqdm import tqdm

    from specdec import Engine, SamplingParams
    from specdec.bench.questions import load_questions
    from specdec.models.loader import load_model, pick_dtype

    torch.set_num_threads(args.threads)
    questions = load_questions(args.questions, args.per_category)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    report = {"settings": settings(args, len(questions)), "records": []}
    total = len(args.dtypes) * len(questions) * (1 + len(args.drafters))
    bar = tqdm(total=total, desc="flip-rate", unit="gen", dynamic_ncols=True)
    started = time.perf_counter()
    for dtype in args.dtypes:
        plain_engine = Engine.from_pretrained(args.target, dtype=dtype)
        plain: dict[int, tuple[list[int], list[int]]] = {}
        for q in questions:
            bar.set_postfix_str(f"{dtype} plain q{q.question_id}")
            out = plain_engine.generate(q.prompt, params, chat=True)
            plain[q.question_id] = (out.prompt_token_ids, out.token_ids)
            bar.update()
        del plain_engine
        gap_model = load_model(args.target, pick_dtype(dtype)).model
        for drafter in args.drafters:
            engine = Engine.from_pretrained(args.target, drafter=drafter, dtype=dtype)
            for q in questions:
                bar.set_postfix_str(f"{dtype} {drafter} q{q.question_id}")
                out = engine.generate(q.prompt, params, chat=True)
                prompt_ids, plain_ids = plain[q.question_id]
                flip = first_flip(gap_model, prompt_ids, plain_ids, out.token_ids)
                report["records"].append(asdict(Record(dtype, drafter, q.question_id, q.category, len(plain_ids),
                                                       len(out.token_ids), out.stats.tau, flip)))
                bar.update()
            del engine
            report["settings"]["elapsed_s"] = round(time.perf_counter() - started, 1)
            write(report, args.out)  # partial results survive an interrupted run
        del gap_model
    bar.close()
    return report


def settings(args: argparse.Namespace, num_questions: int) -> dict:
    import torch

    flags = sorted(set(re.findall(r"\b(avx2|avx512f|avx512_bf16|amx_tile)\b", _cpuinfo())))
    return {"questions": args.questions, "per_category": args.per_category, "num_questions": num_questions,
            "max_new_tokens": args.max_new_tokens, "dtypes": list(args.dtypes), "drafters": list(args.drafters),
            "target": args.target or "embedded SmolLM2-135M-Instruct", "chat_template": True, "threads": args.threads,
            "torch": torch.__version__, "cpu": platform.processor() or platform.machine(), "cpu_flags": flags,
            "command": "python " + " ".join(sys.argv)}


def _cpuinfo() -> str:
    try:
        return Path("/proc/cpuinfo").read_text()
    except OSError:
        return ""


def table(report: dict) -> str:
    """One row per dtype and drafter: flips / questions, and the positions and gaps of the flips."""
    rows = ["| dtype | drafter | flipped / questions | share | first flip at token | top-2 logit gap there | "
            "rank of the speculative token there |",
            "|---|---|---|---|---|---|---|"]
    keys = dict.fromkeys((r["dtype"], r["drafter"]) for r in report["records"])
    for dtype, drafter in keys:
        records = [r for r in report["records"] if (r["dtype"], r["drafter"]) == (dtype, drafter)]
        flips = [r["flip"] for r in records if r["flip"] is not None]
        positions = ", ".join(str(f["position"]) for f in flips) or "-"
        gaps = ", ".join(f"{f['top2_gap']:.3g}" for f in flips) or "-"
        ranks = ", ".join(str(f["spec_token_rank"]) for f in flips) or "-"
        rows.append(f"| {dtype} | {drafter} | {len(flips)} / {len(records)} | {len(flips) / len(records):.0%} | "
                    f"{positions} | {gaps} | {ranks} |")
    return "\n".join(rows) + "\n"


def describe(s: dict) -> str:
    return (f"- {', '.join(s['dtypes'])}: {s['num_questions']} Spec-Bench questions ({s['per_category']} per "
            f"category), {s['max_new_tokens']} new tokens, chat template, {s['target']}, torch {s['torch']}, "
            f"{s['threads']} thread(s), CPU flags {' '.join(s['cpu_flags']) or 'unknown'}, "
            f"{s.get('elapsed_s', 0) / 60:.0f} min: `{s['command']}`\n")


def write(report: dict, out: str) -> None:
    path = Path(out)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.with_suffix(".json").write_text(json.dumps(report, indent=1) + "\n")
    runs = report.get("runs") or [report["settings"]]
    header = "Greedy flip rate, speculative against plain decoding.\n\n" + "".join(map(describe, runs)) + "\n"
    path.with_suffix(".md").write_text(header + table(report))


def render(paths: list[str], out: str) -> dict:
    """One report from several runs (say float32 and bfloat16, run separately with different sizes)."""
    reports = [json.loads(Path(p).read_text()) for p in paths]
    merged = {"runs": [run for r in reports for run in r.get("runs") or [r["settings"]]],
              "records": [rec for r in reports for rec in r["records"]]}
    write(merged, out)
    return merged


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.render:
        print(table(render(args.render, args.out)))
        return 0
    if not Path(args.questions).is_file():
        print(f"flip_rate: error: question file {args.questions!r} does not exist", file=sys.stderr)
        return 2
    report = run(args)
    write(report, args.out)
    print(table(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
