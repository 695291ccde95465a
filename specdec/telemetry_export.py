"""Where spans and metrics go, read from the standard OpenTelemetry variables.

- `OTEL_TRACES_EXPORTER` / `OTEL_METRICS_EXPORTER`: comma-separated `otlp`, `console`, `none`, and
  for traces `otlp_file` (OTLP JSON lines appended to the file `SPECDEC_TRACES_FILE`: one line per
  exported batch, the format of the OpenTelemetry Collector's file exporter, which
  `specdec trace-report` reads). Unset: `otlp` when an OTLP endpoint is set for the signal
  (`OTEL_EXPORTER_OTLP_ENDPOINT` or `OTEL_EXPORTER_OTLP_{TRACES,METRICS}_ENDPOINT`), else none: with
  nothing set a process builds no provider at all (the specification's default of `otlp` would
  make every process export to localhost:4317 unasked).
- `OTEL_EXPORTER_OTLP_[TRACES_|METRICS_]PROTOCOL`: `grpc` (default) or `http/protobuf`; endpoint,
  headers, timeout and compression are read by the exporters themselves.
- `OTEL_SERVICE_NAME` / `OTEL_RESOURCE_ATTRIBUTES`: default service.name is specdec-router,
  specdec-target or specdec-draft; every process also carries `specdec.process`.
- `OTEL_TRACES_SAMPLER[_ARG]` (default parentbased_always_on), `OTEL_BSP_*` (batching),
  `OTEL_METRIC_EXPORT_INTERVAL`, `OTEL_SDK_DISABLED=true` (nothing at all).
"""
from __future__ import annotations

import base64
import json
import os
import threading

from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from specdec.errors import InvalidArgument

TRACES_FILE_ENV = "SPECDEC_TRACES_FILE"
_ID_KEYS = ("traceId", "spanId", "parentSpanId")


def exporter_names(signal: str) -> list[str]:
    """signal: TRACES or METRICS. The exporters asked for (none -> [])."""
    if os.environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    raw = os.environ.get(f"OTEL_{signal}_EXPORTER")
    if raw is None:
        endpoints = ("OTEL_EXPORTER_OTLP_ENDPOINT", f"OTEL_EXPORTER_OTLP_{signal}_ENDPOINT")
        return ["otlp"] if any(os.environ.get(name) for name in endpoints) else []
    names = [n.strip() for n in raw.split(",") if n.strip() and n.strip() != "none"]
    allowed = ("otlp", "console", "otlp_file") if signal == "TRACES" else ("otlp", "console")
    for name in names:
        if name not in allowed:
            raise InvalidArgument(f"OTEL_{signal}_EXPORTER: unknown exporter {name!r} (use {', '.join(allowed)}, none)")
    return names


def _protocol(signal: str) -> str:
    protocol = (os.environ.get(f"OTEL_EXPORTER_OTLP_{signal}_PROTOCOL") or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL")
                or "grpc").strip()
    if protocol not in ("grpc", "http/protobuf"):
        raise InvalidArgument(f"OTLP protocol {protocol!r} is not supported (use grpc or http/protobuf)")
    return protocol


def _span_exporter(name: str):
    if name == "console":
        from opentelemetry.sdk.trace.export import ConsoleSpanExporter

        return ConsoleSpanExporter()
    if name == "otlp_file":
        path = os.environ.get(TRACES_FILE_ENV)
        if not path:
            raise InvalidArgument(f"OTEL_TRACES_EXPORTER=otlp_file needs {TRACES_FILE_ENV}=PATH")
        return OtlpJsonFileExporter(path)
    if _protocol("TRACES") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def _metric_exporter(name: str):
    if name == "console":
        from opentelemetry.sdk.metrics.export import ConsoleMetricExporter

        return ConsoleMetricExporter()
    if _protocol("METRICS") == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
    return OTLPMetricExporter()


def _resource(process: str):
    from opentelemetry.sdk.resources import Resource

    attributes = {"specdec.process": process}
    named = os.environ.get("OTEL_SERVICE_NAME") or "service.name=" in os.environ.get("OTEL_RESOURCE_ATTRIBUTES", "")
    if not named:
        attributes["service.name"] = f"specdec-{process}"
    return Resource.create(attributes)


def build_providers(process: str) -> tuple:
    """(TracerProvider or None, MeterProvider or None, shutdown callables) for one process."""
    trace_names, metric_names = exporter_names("TRACES"), exporter_names("METRICS")
    tracer_provider = meter_provider = None
    shutdowns = []
    if trace_names:
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        tracer_provider = TracerProvider(resource=_resource(process))
        for name in trace_names:
            tracer_provider.add_span_processor(BatchSpanProcessor(_span_exporter(name)))
        shutdowns.append(tracer_provider.shutdown)
    if metric_names:
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader

        readers = [PeriodicExportingMetricReader(_metric_exporter(name)) for name in metric_names]
        meter_provider = MeterProvider(metric_readers=readers, resource=_resource(process))
        shutdowns.append(meter_provider.shutdown)
    return tracer_provider, meter_provider, tuple(shutdowns)


def otlp_json(message) -> dict:
    """An OTLP protobuf message (ExportTraceServiceRequest) as OTLP JSON: protobuf's JSON mapping
    with trace and span ids in hex, as the OTLP specification asks (not base64)."""
    from google.protobuf.json_format import MessageToDict

    return _hex_ids(MessageToDict(message))


def _hex_ids(value):
    if isinstance(value, dict):
        return {k: base64.b64decode(v).hex() if k in _ID_KEYS and isinstance(v, str) else _hex_ids(v)
                for k, v in value.items()}
    if isinstance(value, list):
        return [_hex_ids(v) for v in value]
    return value


class OtlpJsonFileExporter(SpanExporter):
    """A SpanExporter appending OTLP JSON lines to a file. Each batch is one os.write on an O_APPEND
    descriptor, so the router, target and draft worker can share one file without mixing lines."""

    def __init__(self, path: str):
        self.path = path
        self._lock = threading.Lock()

    def export(self, spans):
        from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans

        line = (json.dumps(otlp_json(encode_spans(spans)), separators=(",", ":")) + "\n").encode()
        with self._lock:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, line)
            finally:
                os.close(fd)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return True

    def shutdown(self) -> None:
        pass
