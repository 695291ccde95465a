"""`specdec trace-report FILE ...`: per-step latency breakdown (queue, draft, wire, verify, commit) from
exported spans, as a table and a stacked bar plot with one panel per file (say, 1 and 8 users)."""
from __future__ import annotations

import argparse
import json

from specdec.errors import InvalidArgument


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("trace-report", help="per-step latency breakdown from exported OpenTelemetry spans")
    p.add_argument("files", nargs="+", metavar="FILE",
                   help="OTLP JSON lines (OTEL_TRACES_EXPORTER=otlp_file, or a Collector's file exporter)")
    p.add_argument("--labels", default=None, help="comma-separated panel titles, one per FILE (default: file names)")
    p.add_argument("--out", default=None, help="write the stacked bar plot (PNG) here")
    p.add_argument("--max-steps", type=int, default=48, help="plot steps 1..N")
    p.add_argument("--json", action="store_true", help="print the figures as JSON")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specdec import trace_report as report

    labels = args.labels.split(",") if args.labels else list(args.files)
    if len(labels) != len(args.files):
        raise InvalidArgument(f"--labels names {len(labels)} panels for {len(args.files)} files")
    if args.max_steps < 1:
        raise InvalidArgument("--max-steps must be >= 1")
    panels, rows = [], []
    for label, path in zip(labels, args.files):
        spans = report.read_spans(path)
        parts = report.step_parts(spans)
        if not parts:
            raise InvalidArgument(f"{path}: no {report.t.SPAN_VERIFY} spans (was SPECDEC_TRACE_STEPS none?)")
        panels.append((label, report.mean_by_step(parts, args.max_steps)))
        means = report.summary(parts)
        num_traces = len({s.trace_id for s in spans if s.name == report.t.SPAN_VERIFY})
        rows.append({"label": label, "num_requests": num_traces, "num_steps": len(parts),
                     **{f"{name}_ms": round(value * 1e3, 3) for name, value in means.items()},
                     "step_ms": round(sum(means.values()) * 1e3, 3)})
    if args.out:
        report.plot(panels, args.out)
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    names = [f"{name}_ms" for name in report.COMPONENTS] + ["step_ms"]
    print(f"{'':<16}{'requests':>9}{'steps':>7}" + "".join(f"{n[:-3] + ' ms':>11}" for n in names))
    for row in rows:
        print(f"{row['label'][:16]:<16}{row['num_requests']:>9}{row['num_steps']:>7}"
              + "".join(f"{row[n]:>11.1f}" for n in names))
    if args.out:
        print(f"plot: {args.out}")
    return 0
