"""`specdec bench`: the Spec-Bench runner (specdec.bench) from the command line; with --workloads, the
project's own workload prompts instead (specdec.bench.workload_bench).

Exit code 0 when every method reproduced the baseline's greedy tokens, 1 when any did not
(the lossless contract is the one thing a benchmark run can fail on), 2 for bad options.
"""
from __future__ import annotations

import argparse
import shlex
import sys

from specdec.bench.main import SPEC_BENCH_NEW_TOKENS
from specdec.bench.methods import METHODS
from specdec.bench.runner import MODES

WORKLOAD_NEW_TOKENS = 64  # the workload tables' setting


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
    p.add_argument("--max-new-tokens", type=int, default=None,
                   help=f"new tokens per answer (default: Spec-Bench {SPEC_BENCH_NEW_TOKENS}, workloads "
                        f"{WORKLOAD_NEW_TOKENS})")
    p.add_argument("--temperature", type=float, default=0.7, help="the sampling mode's temperature (default 0.7)")
    p.add_argument("--top-p", type=float, default=0.9, help="the sampling mode's top-p (default 0.9)")
    p.add_argument("--seed", type=int, default=0, help="sampling: question i uses seed + i")
    p.add_argument("--target", default=None, help="target checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft model dir (default: the shipped draft, else a random stand-in)")
    p.add_argument("--checkpoint", action="append", default=[], metavar="DRAFTER=DIR",
                   help="a trained checkpoint for medusa, eagle or draft (repeatable); without one, medusa and "
                        "eagle run only where a checkpoint is shipped for the target")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="most draft tokens per step (default: each drafter's own; 8, suffix and ngram 16)")
    p.add_argument("--no-adaptive", action="store_true", help="always draft the maximum")
    p.add_argument("--workloads", nargs="*", default=None, metavar="WORKLOAD",
                   help="run the workload prompts of benchmarks/workloads/ instead of Spec-Bench (no names = all: "
                        "code, json, rag, agent, summarization, creative); per workload tau, acceptance, speedup "
                        "and the accepted-length histogram")
    p.add_argument("--prompts-per-workload", type=int, default=2, help="with --workloads; 0 = all (default 2)")
    p.add_argument("--workload-dir", default=None, help="with --workloads: a directory of WORKLOAD.jsonl files")
    p.add_argument("--out", default=None, help="output directory (default benchmarks/out, "
                                               "benchmarks/out/workloads with --workloads)")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--render-only", action="store_true",
                   help="run nothing: rewrite report.md and the plots from OUT/report.json")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specdec.bench.main import DEFAULT_QUESTIONS, BenchConfig, render_existing, run_benchmark

    if args.workloads is not None:
        return run_workloads(args)
    if args.max_new_tokens is None:
        args.max_new_tokens = SPEC_BENCH_NEW_TOKENS
    args.out = args.out or "benchmarks/out"
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


def run_workloads(args: argparse.Namespace) -> int:
    from specdec.bench.workload_bench import WorkloadBenchConfig, run_workload_bench
    from specdec.bench.workloads import DEFAULT_DIR
    from specdec.errors import InvalidArgument

    if args.render_only:
        raise InvalidArgument("--render-only applies to Spec-Bench runs, not --workloads")
    if args.max_new_tokens is None:
        args.max_new_tokens = WORKLOAD_NEW_TOKENS
    if args.prompts_per_workload < 0 or args.max_new_tokens < 1 or not 1 <= (args.num_speculative_tokens or 1) <= 64:
        raise InvalidArgument("need --prompts-per-workload >= 0, --max-new-tokens >= 1 and "
                              "--num-speculative-tokens in [1, 64]")
    config = WorkloadBenchConfig(
        directory=args.workload_dir or DEFAULT_DIR, workloads=tuple(args.workloads) or None,
        per_workload=args.prompts_per_workload or None, methods=tuple(args.methods) if args.methods else None,
        max_new_tokens=args.max_new_tokens, seed=args.seed, target=args.target, checkpoints=checkpoints(args),
        dtype=args.dtype, num_speculative_tokens=args.num_speculative_tokens, adaptive=not args.no_adaptive,
        out_dir=args.out or "benchmarks/out/workloads", plots=not args.no_plots, progress=not args.no_progress,
        command="specdec " + shlex.join(sys.argv[1:]) if sys.argv[1:2] == ["bench"] else "specdec bench --workloads")
    report, code = run_workload_bench(config)
    for workload in report["settings"]["workloads"]:
        row = report["results"][workload]
        print(f"{workload}: " + ", ".join(f"{name} tau {m['tau']:.2f} {m['speedup']:.2f}x" for name, m in row.items()),
              file=sys.stderr)
    for goal in report["goals"]:
        print(f"goal {goal['workload']}: {goal['method']} tau {goal['tau'] or 0:.2f} >= {goal['tau_goal']}: "
              f"{'met' if goal['met'] else 'not met'}", file=sys.stderr)
    if report["total_mismatches"]:
        print(f"LOSSLESS CHECK FAILED: {report['total_mismatches']} greedy generations differ from plain decoding",
              file=sys.stderr)
    print(f"wrote {config.out_dir}/report.json, report.md" + ("" if args.no_plots else " and plots"), file=sys.stderr)
    return code


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
