"""What tracing costs, and where each decode step's time goes (the README's tracing table and plot).

    .venv/bin/python benchmarks/tracing.py                 # embedded SmolLM2 + shipped draft model
    .venv/bin/python benchmarks/tracing.py --rounds 3 --max-new-tokens 64

1. Overhead: four stacks started side by side (router + draft worker + target worker each), one
   generation at a time, greedy, the stacks interleaved prompt by prompt and round by round so that
   load from other processes on a shared machine hits all alike:
     off        no OTEL_* variable set (no tracer, no metrics)
     metrics    Prometheus endpoints on, tracing off
     every step OTEL_TRACES_EXPORTER=otlp_file, SPECDEC_TRACE_STEPS=all
     sampled    OTEL_TRACES_EXPORTER=otlp_file, SPECDEC_TRACE_STEPS at its default (every:16,over:500)
   Each configuration must produce the same tokens: tracing never changes an output.
2. CPU per decode step that tracing adds, measured in process (CPU time of all threads, so load
   from other processes does not enter): the target's step-span code for one sequence with tracing
   off, sampled and every step, and the export behind it (OTLP protobuf encoding, or OTLP JSON lines).
3. Breakdown: the `every step` stack under 1 and then 8 concurrent users (specdec.loadtest); its spans,
   split per level by trace once the stack has stopped (and flushed), go through
   `specdec trace-report` into a stacked per-step plot. With `--only breakdown --speculate-always` the
   stack drafts --k tokens every step (the speculation policy off), so drafting shows in the plot.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specdec.bench.machine import cpu_info  # noqa: E402
from specdec.core.types import SamplingParams  # noqa: E402
from specdec.launch import start_stack  # noqa: E402
from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig  # noqa: E402

PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number, with a docstring.",
    "Repeat this list exactly, then add one more fruit: apple, banana, cherry, date, elderberry, fig.",
    "Explain in three sentences why the sky is blue.",
    "Translate to French: The cat sits on the mat and looks at the garden.",
]


def modes(out: Path) -> dict[str, tuple[dict, int]]:
    """name -> (environment of its processes, metrics port)."""
    traced = {"OTEL_TRACES_EXPORTER": "otlp_file"}
    return {"off": ({}, -1), "metrics": ({}, 0),
            "every step": ({**traced, "SPECDEC_TRACES_FILE": str(out / "spans_all.jsonl"),
                            "SPECDEC_TRACE_STEPS": "all"}, -1),
            "sampled": ({**traced, "SPECDEC_TRACES_FILE": str(out / "spans_sampled.jsonl")}, -1)}


def stack_config(args, metrics_port: int, speculate_always: bool = False) -> StackConfig:
    """speculate_always: every step drafts args.k tokens (no adaptive depth, no load-aware budget), so
    the breakdown shows drafting even where the policy would switch it off."""
    adaptive = not speculate_always
    return StackConfig(
        router=RouterConfig(metrics_port=metrics_port, http_port=-1, max_active=8),
        targets=(TargetConfig(model=args.target, num_threads=1, metrics_port=metrics_port, adaptive=adaptive,
                              load_aware=adaptive),),
        drafts=(DraftConfig(drafter="draft", target_model=args.target, num_threads=1, metrics_port=metrics_port,
                            adaptive=adaptive, num_speculative_tokens=args.k if speculate_always else 8),))


def overhead(args, stacks: dict, params: SamplingParams) -> list[dict]:
    from specdec.client import Client

    clients = {name: Client(stack.address) for name, stack in stacks.items()}
    for client in clients.values():
        client.generate(PROMPTS[0], SamplingParams(max_new_tokens=8), chat=True, timeout_s=600)  # warm-up
    per_round = {name: [] for name in clients}  # tokens/s of each round
    tokens = {name: [] for name in clients}
    names = list(clients)
    for r in range(args.rounds):
        elapsed, counts = dict.fromkeys(names, 0.0), dict.fromkeys(names, 0)
        for i, prompt in enumerate(PROMPTS):
            order = names[i % len(names):] + names[:i % len(names)]  # rotate who goes first
            for name in order:
                start = time.perf_counter()
                out = clients[name].generate(prompt, params, chat=True, timeout_s=600)
                elapsed[name] += time.perf_counter() - start
                counts[name] += len(out.token_ids)
                tokens[name].append((r, i, list(out.token_ids)))
        for name in names:
            per_round[name].append(counts[name] / elapsed[name])
        print(f"round {r + 1}: " + ", ".join(f"{n} {per_round[n][-1]:.2f}" for n in names), flush=True)
    base = tokens["off"]
    rows = []
    for name in names:
        ratios = [v / b for v, b in zip(per_round[name], per_round["off"])]
        rows.append({"mode": name, "tokens_per_s": round(statistics.mean(per_round[name]), 2),
                     "vs_off": round(statistics.mean(ratios), 3),
                     "vs_off_min": round(min(ratios), 3), "vs_off_max": round(max(ratios), 3),
                     "same_tokens": sorted(tokens[name]) == sorted(base)})
    for client in clients.values():
        client.close()
    return rows


def step_cpu_us(num_steps: int = 4000) -> dict[str, float]:
    """CPU microseconds per decode step (one sequence) of the target's tracing code plus its export."""
    from types import SimpleNamespace

    from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    from specdec import telemetry as t
    from specdec.step import StepTimes
    from specdec.telemetry_export import OtlpJsonFileExporter
    from specdec.telemetry_trace import TargetInstruments, TargetStepTrace

    class ProtobufOnly(SpanExporter):  # what the otlp exporter does before the network
        def export(self, spans):
            encode_spans(spans).SerializeToString()
            return SpanExportResult.SUCCESS

    def run(telemetry: t.Telemetry) -> float:
        instruments = TargetInstruments(telemetry.metrics, lambda: None)
        parent = None
        if telemetry.tracing:
            with telemetry.span("Admit"):
                parent = telemetry.current_context()
        state = SimpleNamespace(trace_parent=parent, version_since=time.monotonic(), draft_at=time.monotonic(),
                                draft_trace=None)
        entry = SimpleNamespace(seq=SimpleNamespace(version=0, finish_reason=None), drafted=None)
        tree, result = SimpleNamespace(num_nodes=4), SimpleNamespace(num_accepted=2, num_drafted=4, token_ids=[1, 2, 3])
        start = time.process_time()
        for _ in range(num_steps):  # what TargetWorker._step adds around its forward
            times = StepTimes(time.monotonic(), time.monotonic())
            entry.seq.version += 1
            trace = telemetry.tracing and TargetStepTrace(telemetry, [("s", state, object())], {})
            instruments.step(1, 0.05, [result])
            instruments.node_budget.observe(4)
            if trace:
                trace.finish([entry], [tree], [result], times)
        telemetry.shutdown()  # the export thread's work counts too
        return (time.process_time() - start) / num_steps * 1e6

    def traced(exporter, steps: str) -> t.Telemetry:
        provider = TracerProvider()
        provider.add_span_processor(BatchSpanProcessor(exporter, max_queue_size=num_steps * 2))
        return t.Telemetry(provider, t.StepSampling.parse(steps), shutdowns=(provider.shutdown,))

    json_file = Path(f"/tmp/specdec-tracing-cpu-{os.getpid()}.jsonl")
    try:
        return {"off": round(run(t.Telemetry.off()), 1),
                "sampled, otlp": round(run(traced(ProtobufOnly(), t.DEFAULT_STEPS)), 1),
                "every step, otlp": round(run(traced(ProtobufOnly(), "all")), 1),
                "every step, otlp_file": round(run(traced(OtlpJsonFileExporter(str(json_file)), "all")), 1)}
    finally:
        json_file.unlink(missing_ok=True)


def split_by_level(spans_file: Path, windows: dict[str, tuple[int, int]], out: Path) -> dict[str, Path]:
    """One OTLP JSON file per level: the spans of the requests whose request span started in its window."""
    from specdec import telemetry as t
    from specdec.trace_report import spans_from_otlp

    lines = [json.loads(line) for line in spans_file.read_text().splitlines() if line.strip()]
    spans = [s for doc in lines for s in spans_from_otlp(doc)]
    files = {}
    for level, (begin, end) in windows.items():
        traces = {s.trace_id for s in spans if t.GEN_AI_OPERATION in s.attributes and begin <= s.start_ns < end}
        path = files[level] = out / f"spans_{level}.jsonl"
        with path.open("w") as f:
            for doc in lines:
                kept = {"resourceSpans": [
                    {**rs, "scopeSpans": [{**ss, "spans": [s for s in ss.get("spans", []) if s["traceId"] in traces]}
                                          for ss in rs.get("scopeSpans", [])]}
                    for rs in doc.get("resourceSpans", [])]}
                f.write(json.dumps(kept) + "\n")
    return files


def load_levels(args, stack) -> dict[str, tuple[int, int]]:
    """1 and then 8 concurrent users; the wall-clock window (ns) of each level."""
    from specdec.loadtest import run_level

    windows = {}
    for users in (1, 8):
        begin = time.time_ns()
        level = run_level(stack.address, users, users * args.requests_per_user,
                          SamplingParams(max_new_tokens=args.max_new_tokens))
        windows[f"{users}user"] = (begin, time.time_ns())
        print(f"{users} users: {level.output_tokens_per_s:.2f} tok/s, mean batch {level.mean_batch_size:.2f}",
              flush=True)
    return windows


def breakdown(args, spans_file: Path, windows: dict, out: Path) -> list[dict]:
    from specdec.cli import main as cli_main

    files = split_by_level(spans_file, windows, out)
    report = out / "trace_report.json"
    argv = ["trace-report", *map(str, files.values()), "--labels", "1 user,8 users",
            "--out", str(args.plot), "--json"]
    import contextlib
    import io

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer):
        cli_main(argv)
    rows = json.loads(buffer.getvalue())
    report.write_text(json.dumps(rows, indent=2))
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", default=None, help="target dir (default: embedded SmolLM2-135M-Instruct)")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=3, help="passes over the prompts")
    parser.add_argument("--requests-per-user", type=int, default=2, help="breakdown: requests per user and level")
    parser.add_argument("--only", choices=("overhead", "breakdown"), default=None, help="run one part")
    parser.add_argument("--speculate-always", action="store_true",
                        help="breakdown: draft --k tokens every step (the policy off), to see drafting in the plot")
    parser.add_argument("--k", type=int, default=4, help="draft tokens per step with --speculate-always")
    parser.add_argument("--out", default="/tmp/specdec-tracing", help="spans and figures go here")
    parser.add_argument("--plot", default="benchmarks/results/trace_steps.png")
    parser.add_argument("--json-out", default="benchmarks/results/tracing.json")
    args = parser.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for old in out.glob("*.jsonl"):
        old.unlink()
    result = {"machine": cpu_info(), "max_new_tokens": args.max_new_tokens, "rounds": args.rounds,
              "speculate_always": args.speculate_always}
    if args.only != "breakdown":
        result["step_cpu_us"] = step_cpu_us()
        print(f"CPU per step, us: {result['step_cpu_us']}", flush=True)
    chosen = {n: m for n, m in modes(out).items() if args.only is None or n == "every step" or args.only == "overhead"}
    stacks = {}
    try:
        for name, (env, metrics_port) in chosen.items():
            breakdown_only = args.only == "breakdown"
            stacks[name] = start_stack(stack_config(args, metrics_port, breakdown_only and args.speculate_always),
                                       env=env)
            print(f"{name}: router on {stacks[name].address}", flush=True)
        if args.only != "breakdown":
            result["overhead"] = overhead(args, stacks, SamplingParams(max_new_tokens=args.max_new_tokens))
        for name in [n for n in stacks if n != "every step"]:
            stacks.pop(name).stop()  # the breakdown runs alone
        if args.only != "overhead":
            windows = load_levels(args, stacks["every step"])
    finally:
        for stack in stacks.values():
            stack.stop()  # each process exports what it still holds as it stops
    if args.only != "overhead":
        result["breakdown"] = breakdown(args, out / "spans_all.jsonl", windows, out)
    Path(args.json_out).write_text(json.dumps(result, indent=2))
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
