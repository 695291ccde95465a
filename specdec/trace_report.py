"""Where each decode step's time went, from exported spans (`specdec trace-report FILE ...`).

Reads OTLP JSON lines (what the `otlp_file` exporter and the OpenTelemetry Collector's file exporter
write: one ExportTraceServiceRequest per line) and splits every traced step of every request into
the parts of its critical path, from the previous commit's publication to this one's:

    queue   the sequence waited ready at the target (for the batch, or for a draft that never came)
    draft   drafting: the in-target drafter, or the draft worker's draft when it was not drafted
            ahead (a pipelined draft was made while the target verified the step before)
    wire    the rest of the draft worker's turnaround: the commit out, the draft back, its queues
    verify  the target forward and the verdicts
    commit  KV commit, sequence commit, commit messages out

All but `draft` are measured on the target's clock alone (the verify span's attributes), so clock
skew between machines does not enter; `draft` is the linked draft span's own duration.
"""
from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path

from specdec import telemetry as t
from specdec.errors import InvalidArgument

COMPONENTS = ("queue", "draft", "wire", "verify", "commit")
COLORS = ("#bbbbbb", "#4c72b0", "#dd8452", "#55a868", "#c44e52")


@dataclass(frozen=True)
class Span:
    trace_id: str
    span_id: str
    parent_id: str  # "" for a root span
    name: str
    start_ns: int
    end_ns: int
    attributes: dict
    links: tuple[tuple[str, str], ...]  # (trace_id, span_id) of linked spans
    process: str  # the resource's specdec.process (router, target, draft), or its service.name

    @property
    def duration_s(self) -> float:
        return (self.end_ns - self.start_ns) / 1e9


def _value(v: dict):
    for key in ("stringValue", "boolValue", "doubleValue"):
        if key in v:
            return v[key]
    if "intValue" in v:
        return int(v["intValue"])
    if "arrayValue" in v:
        return [_value(x) for x in v["arrayValue"].get("values", [])]
    return None


def _attributes(items) -> dict:
    return {a["key"]: _value(a.get("value", {})) for a in items or ()}


def spans_from_otlp(document: dict) -> list[Span]:
    """The spans of one OTLP JSON ExportTraceServiceRequest."""
    spans = []
    for resource_spans in document.get("resourceSpans", []):
        resource = _attributes(resource_spans.get("resource", {}).get("attributes"))
        process = resource.get(t.PROCESS) or resource.get("service.name", "")
        for scope_spans in resource_spans.get("scopeSpans", []):
            for s in scope_spans.get("spans", []):
                links = tuple((link["traceId"], link["spanId"]) for link in s.get("links", []))
                spans.append(Span(s["traceId"], s["spanId"], s.get("parentSpanId", ""), s["name"],
                                  int(s["startTimeUnixNano"]), int(s["endTimeUnixNano"]),
                                  _attributes(s.get("attributes")), links, process))
    return spans


def read_spans(path: str | Path) -> list[Span]:
    try:
        lines = Path(path).read_text().splitlines()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {str(path)!r}: {exc}") from exc
    spans = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            spans += spans_from_otlp(json.loads(line))
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"{path}:{number}: not an OTLP JSON trace export ({exc})") from exc
    return spans


def step_parts(spans: list[Span]) -> list[tuple[int, dict[str, float]]]:
    """(step number, seconds per component) for every verify span."""
    by_id = {(s.trace_id, s.span_id): s for s in spans}
    in_target = {(s.trace_id, s.parent_id, s.attributes.get(t.STEP)): s for s in spans
                 if s.name == t.SPAN_DRAFT and s.attributes.get(t.DRAFT_SOURCE) == "in_target"}
    out = []
    for span in spans:
        if span.name != t.SPAN_VERIFY:
            continue
        a = span.attributes
        step = int(a.get(t.STEP, 0))
        draft_s = wire_s = 0.0
        if a.get(t.DRAFT_SOURCE) == "in_target":
            drafted = in_target.get((span.trace_id, span.parent_id, step))
            draft_s = drafted.duration_s if drafted is not None else 0.0
        elif t.TURNAROUND_S in a:
            linked = [by_id[link] for link in span.links if link in by_id and by_id[link].name == t.SPAN_DRAFT]
            fresh = [d for d in linked if not d.attributes.get(t.DRAFT_PIPELINED)]
            draft_s = min(fresh[0].duration_s, a[t.TURNAROUND_S]) if fresh else 0.0
            wire_s = a[t.TURNAROUND_S] - draft_s
        out.append((step, {"queue": a.get(t.QUEUE_S, 0.0), "draft": draft_s, "wire": wire_s,
                           "verify": a.get(t.FORWARD_S, 0.0), "commit": a.get(t.COMMIT_S, 0.0)}))
    return out


def mean_by_step(parts: list[tuple[int, dict[str, float]]], max_steps: int) -> dict[int, dict[str, float]]:
    """Mean seconds per component at each step number (over requests), steps 1..max_steps."""
    sums: dict[int, dict[str, float]] = defaultdict(lambda: dict.fromkeys(COMPONENTS, 0.0))
    counts: dict[int, int] = defaultdict(int)
    for step, values in parts:
        if 1 <= step <= max_steps:
            counts[step] += 1
            for name in COMPONENTS:
                sums[step][name] += values[name]
    return {step: {name: sums[step][name] / counts[step] for name in COMPONENTS} for step in sorted(counts)}


def summary(parts: list[tuple[int, dict[str, float]]]) -> dict[str, float]:
    """Mean seconds per component over every traced step."""
    if not parts:
        return dict.fromkeys(COMPONENTS, 0.0)
    return {name: sum(values[name] for _, values in parts) / len(parts) for name in COMPONENTS}


def plot(panels: list[tuple[str, dict[int, dict[str, float]]]], path: str | Path) -> None:
    """One stacked bar chart per panel (label, mean_by_step), side by side, milliseconds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4), sharey=True, squeeze=False)
    for ax, (label, by_step) in zip(axes[0], panels):
        steps = list(by_step)
        bottom = [0.0] * len(steps)
        for name, color in zip(COMPONENTS, COLORS):
            heights = [by_step[s][name] * 1e3 for s in steps]
            ax.bar(steps, heights, bottom=bottom, color=color, label=name, width=0.85)
            bottom = [b + h for b, h in zip(bottom, heights)]
        ax.set_title(label)
        ax.set_xlabel("decode step")
        ax.grid(axis="y", alpha=0.3)
    axes[0][0].set_ylabel("mean ms per step")
    axes[0][-1].legend(loc="upper right", fontsize=8)
    fig.suptitle("Per-step latency breakdown (from OpenTelemetry spans)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
