"""`specdec bench`: the Spec-Bench runner (specdec.bench) from the command line.

Exit code 0 when every method reproduced the baseline's greedy tokens, 1 when any did not
(the lossless contract is the one thing a benchmark run can fail on), 2 for bad options.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from specdec.bench.methods import METHODS
from specdec.bench.runner import MODES


def add_parser(subparsers) -> None:
    names = [m.name for m in METHODS]
    p = subparsers.add_parser("bench", help="Spec-Bench: every method and the transformers peers, side by side",
                              description="Runs Spec-Bench questions through the project's methods and the "
                                          "transformers peers on one target; writes report.json, report.md and plots.")
    p.add_argument("--questions", default=None,
                   help="question.jsonl (default: the vendored benchmarks/spec_bench/question.jsonl)")
    p.add_argument("--questions-per-category", type=int, default=1, help="0 = all (default 1: fits 30 minutes on 2 cores)")
    p.add_argument("--categories", nargs="+", default=None, help="Spec-Bench categories (default: all six)")
    p.add_argument("--methods", nargs="+", default=None, metavar="METHOD",
                   help=f"default: every available one of {', '.join(names)} (plain, the baseline, always runs)")
    p.add_argument("--mode", choices=(*MODES, "both"), default="both",
                   help="greedy (with the equality check), sampling, or both (default)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.7, help="the sampling mode's temperature (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.9, help="the sampling mode's top-p (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="sampling: question i uses seed + i")
    p.add_argument("--target", default=None, help="target checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft model dir (default: the shipped draft, else a random stand-in)")
    p.add_argument("--checkpoint", action="append", default=[], metavar="DRAFTER=DIR",
                   help="a trained checkpoint for medusa, eagle or draft (repeatable); without one, medusa and "
                        "eagle run only where a checkpoint is shipped for the target")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--num-speculative-tokens", type=int, default=8)
    p.add_argument("--no-adaptive", action="store_true", help="always draft the maximum")
    p.add_argument("--out", default="benchmarks/out", help="output directory (default benchmarks/out)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: rewrite report.md and the plots from OUT/report.json")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specdec.bench.main import DEFAULT_QUESTIONS, BenchConfig, render_existing, run_benchmark

    if args.render_only:
        return _summarize(args, *render_existing(args.out, not args.no_plots))
    config = BenchConfig(
        questions_path=args.questions or DEFAULT_QUESTIONS,
        questions_per_category=args.questions_per_category or None,
        categories=tuple(args.categories) if args.categories else None,
        methods=tuple(args.methods) if args.methods else None,
        modes=MODES if args.mode == "both" else (args.mode,),
        max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_p=args.top_p, seed=args.seed,
        target=args.target, checkpoints=checkpoints(args), dtype=args.dtype, num_speculative_tokens=args.num_speculative_tokens,
        adaptive=not args.no_adaptive, out_dir=args.out, plots=not args.no_plots, progress=not args.no_progress,
        command="specdec " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "specdec bench")
    return _summarize(args, *run_benchmark(config))


def checkpoints(args: argparse.Namespace) -> tuple[tuple[str, str], ...]:
    from specdec.drafters import TRAINED_DRAFTERS
    from specdec.errors import InvalidArgument

    pairs = [("draft", args.draft)] if args.draft else []
    for item in args.checkpoint:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise InvalidArgument(f"--checkpoint wants DRAFTER=DIR, got {item!r}")
        if name not in TRAINED_DRAFTERS:
            raise InvalidArgument(f"--checkpoint {item!r}: only {', '.join(TRAINED_DRAFTERS)} take a checkpoint")
        pairs.append((name, path))
    return tuple(pairs)


def _summarize(args: argparse.Namespace, report: dict, code: int) -> int:
    for run_ in report["runs"]:
        overall = {name: r["overall"] for name, r in run_["results"].items()}
        line = ", ".join(f"{n} {m['speedup']:.2f}x" for n, m in overall.items() if m["speedup"] is not None)
        print(f"{run_['mode']}: {line}", file=sys.stderr)
        if run_["lossless_checked"] and run_["total_mismatches"]:
            print(f"{run_['mode']}: LOSSLESS CHECK FAILED: mismatching generations per method: "
                  f"{run_['mismatches']}", file=sys.stderr)
    print(f"wrote {args.out}/report.json, report.md" + ("" if args.no_plots else " and plots"), file=sys.stderr)
    return code
