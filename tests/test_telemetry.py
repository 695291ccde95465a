"""Telemetry without processes: configuration from OTEL_*, step sampling, spans into the SDK's
in-memory exporter, per-sequence context on the Verify stream, metrics in Prometheus and OTLP form,
and the per-step breakdown of trace-report."""
from __future__ import annotations

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from specdec import telemetry as t
from specdec.errors import InvalidArgument
from specdec.rpc.v1 import target_pb2
from specdec.telemetry_export import exporter_names
from specdec.telemetry_metrics import Metrics, SpecDecodeCounters
from specdec.telemetry_trace import draft_span
from specdec.trace_report import Span, step_parts

OTEL_VARS = ("OTEL_TRACES_EXPORTER", "OTEL_METRICS_EXPORTER", "OTEL_EXPORTER_OTLP_ENDPOINT",
             "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_SDK_DISABLED")


@pytest.fixture
def clean_env(monkeypatch):
    for name in (*OTEL_VARS, t.STEPS_ENV):
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_nothing_set_means_no_tracer_and_no_metrics(clean_env):
    telemetry = t.setup("target")
    assert not telemetry.tracing and telemetry.tracer is None and not telemetry.metrics.enabled
    assert telemetry.server_interceptors() == [] and telemetry.outgoing_metadata(None) == ()
    channel = object()
    assert telemetry.traced_channel(channel) is channel


def test_exporters_come_from_the_standard_variables(clean_env):
    assert exporter_names("TRACES") == []
    clean_env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4317")
    assert exporter_names("TRACES") == ["otlp"] and exporter_names("METRICS") == ["otlp"]
    clean_env.setenv("OTEL_TRACES_EXPORTER", "console,otlp_file")
    assert exporter_names("TRACES") == ["console", "otlp_file"]
    clean_env.setenv("OTEL_TRACES_EXPORTER", "none")
    assert exporter_names("TRACES") == []
    clean_env.setenv("OTEL_TRACES_EXPORTER", "zipkin")
    with pytest.raises(InvalidArgument, match="zipkin"):
        exporter_names("TRACES")
    clean_env.setenv("OTEL_SDK_DISABLED", "true")
    assert exporter_names("TRACES") == exporter_names("METRICS") == []


def test_step_sampling_rules():
    every4 = t.StepSampling.parse("every:4")
    assert [s for s in range(1, 14) if every4.keeps(s, 0.0)] == [1, 5, 9, 13]
    assert every4.keeps(7, 0.0, last=True)
    slow = t.StepSampling.parse("over:250")
    assert not slow.keeps(1, 0.2) and slow.keeps(2, 0.3)
    assert all(t.StepSampling.parse("all").keeps(s, 0.0) for s in range(1, 50))
    assert not any(t.StepSampling.parse("none").keeps(s, 9.9, last=True) for s in range(1, 50))
    default = t.StepSampling.parse(t.DEFAULT_STEPS)
    assert sum(default.keeps(s, 0.05) for s in range(1, 1001)) == 63  # a long generation: dozens, not thousands
    for bad in ("every:0", "over:-1", "sometimes", "all:3"):
        with pytest.raises(InvalidArgument, match=t.STEPS_ENV):
            t.StepSampling.parse(bad)


def in_memory(steps: str = "all") -> tuple[t.Telemetry, InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return t.Telemetry(provider, t.StepSampling.parse(steps)), exporter


def test_step_spans_are_stamped_from_the_steps_clock_and_linked_per_sequence():
    telemetry, exporter = in_memory()
    with telemetry.span("Admit") as admit:  # what the gRPC server span is on the target
        parent = telemetry.current_context()
    start = 1000.0  # time.monotonic() readings
    message = target_pb2.DraftMessage(sequence_id="a", version=4)
    message.trace_context.update(draft_span(telemetry, parent, 5, start, 0.25, 3, 3, pipelined=False))
    assert "traceparent" in message.trace_context
    received = target_pb2.DraftMessage.FromString(message.SerializeToString())  # over the Verify stream
    telemetry.emit(t.SPAN_VERIFY, parent, start + 0.3, start + 0.4, {t.STEP: 5}, telemetry.links_from(
        received.trace_context))
    admit_span, draft, verify = exporter.get_finished_spans()
    assert draft.parent.span_id == verify.parent.span_id == admit_span.context.span_id
    assert draft.attributes[t.STEP] == 5 and draft.attributes[t.DRAFT_DEPTH] == 3
    assert (draft.end_time - draft.start_time) == pytest.approx(0.25e9, abs=1e3)
    assert verify.start_time - draft.start_time == pytest.approx(0.3e9, abs=1e3)
    [link] = verify.links
    assert link.context.span_id == draft.context.span_id and link.context.trace_id == admit.get_span_context().trace_id


def test_unsampled_steps_make_no_span_and_carry_no_context():
    telemetry, exporter = in_memory("every:4")
    with telemetry.span("Admit"):
        parent = telemetry.current_context()
    assert draft_span(telemetry, parent, 2, 0.0, 0.01, 2, 2, pipelined=True) == {}
    assert draft_span(telemetry, None, 1, 0.0, 0.01, 2, 2, pipelined=True) == {}  # no trace for this sequence
    assert [s.name for s in exporter.get_finished_spans()] == ["Admit"]
    assert telemetry.links_from({}) == []


def test_spans_of_an_unsampled_trace_build_no_attributes():
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter = InMemorySpanExporter()
    provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(0.0)))  # OTEL_TRACES_SAMPLER=parentbased_traceidratio
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    telemetry = t.Telemetry(provider, t.StepSampling.parse("all"))
    with telemetry.span("Admit"):
        parent = telemetry.current_context()
    built = []
    telemetry.emit(t.SPAN_VERIFY, parent, 0.0, 0.1, lambda: built.append(1) or {t.STEP: 1})
    assert built == [] and exporter.get_finished_spans() == ()
    assert draft_span(telemetry, parent, 1, 0.0, 0.01, 2, 2, pipelined=False) == {}


def test_spec_decode_counters_in_prometheus_and_otlp():
    reader = InMemoryMetricReader()
    metrics = Metrics(prometheus=True, meter=MeterProvider(metric_readers=[reader]).get_meter("test"))
    counters = SpecDecodeCounters(metrics)
    for drafted, accepted in ((4, 2), (4, 4), (3, 0), (0, 0)):
        counters.record(drafted, accepted)
    samples = {(s.name, tuple(s.labels.items())): s.value
               for f in text_string_to_metric_families(generate_latest(metrics.registry).decode()) for s in f.samples}
    assert samples[("specdec:spec_decode_num_drafts_total", ())] == 3
    assert samples[("specdec:spec_decode_num_draft_tokens_total", ())] == 11
    assert samples[("specdec:spec_decode_num_accepted_tokens_total", ())] == 6
    per_pos = [samples[("specdec:spec_decode_num_accepted_tokens_per_pos_total", (("position", str(i)),))]
               for i in range(4)]
    assert per_pos == [2, 2, 1, 1]
    exported = {m.name: m.data.data_points for rm in reader.get_metrics_data().resource_metrics
                for sm in rm.scope_metrics for m in sm.metrics}
    assert sum(p.value for p in exported["specdec.spec_decode_num_drafts"]) == 3
    assert {p.attributes["position"]: p.value for p in exported["specdec.spec_decode_num_accepted_tokens_per_pos"]
            } == {"0": 2, "1": 2, "2": 1, "3": 1}


def span(name, span_id, start_s, end_s, links=(), parent="p", **attributes) -> Span:
    return Span("t1", span_id, parent, name, int(start_s * 1e9), int(end_s * 1e9), attributes,
                tuple(("t1", link) for link in links), "target")


def test_trace_report_splits_a_step_into_its_critical_path():
    common = {t.QUEUE_S: 0.01, t.FORWARD_S: 0.05, t.COMMIT_S: 0.002}
    spans = [
        span(t.SPAN_DRAFT, "d1", 0.0, 0.02, parent="a", **{t.STEP: 1, t.DRAFT_PIPELINED: False}),
        span(t.SPAN_VERIFY, "v1", 0.1, 0.2, links=("d1",), **common,
             **{t.STEP: 1, t.DRAFT_SOURCE: "draft_worker", t.TURNAROUND_S: 0.03}),
        span(t.SPAN_DRAFT, "d2", 0.1, 0.12, parent="a", **{t.STEP: 2, t.DRAFT_PIPELINED: True}),
        span(t.SPAN_VERIFY, "v2", 0.3, 0.4, links=("d2",), **common,
             **{t.STEP: 2, t.DRAFT_SOURCE: "draft_worker", t.TURNAROUND_S: 0.004}),
        span(t.SPAN_DRAFT, "d3", 0.5, 0.507, **{t.STEP: 3, t.DRAFT_SOURCE: "in_target"}),
        span(t.SPAN_VERIFY, "v3", 0.51, 0.6, **common, **{t.STEP: 3, t.DRAFT_SOURCE: "in_target"}),
    ]
    parts = dict(step_parts(spans))
    assert parts[1]["draft"] == pytest.approx(0.02) and parts[1]["wire"] == pytest.approx(0.01)
    assert parts[2]["draft"] == 0.0 and parts[2]["wire"] == pytest.approx(0.004)  # drafted ahead: off the path
    assert parts[3]["draft"] == pytest.approx(0.007) and parts[3]["wire"] == 0.0
    assert all(p["queue"] == 0.01 and p["verify"] == 0.05 and p["commit"] == 0.002 for p in parts.values())
