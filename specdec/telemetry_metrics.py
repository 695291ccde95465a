"""Metrics of the serving processes: a Prometheus endpoint (`--metrics-port`) and OTLP when configured.

Prometheus names are the ones a vLLM user already graphs (`specdec:spec_decode_num_drafts` where
vLLM has `vllm:spec_decode_num_drafts`; counters are exposed with the `_total` suffix) and the
OpenTelemetry GenAI server histograms (`gen_ai.server.time_to_first_token`,
`gen_ai.server.time_per_output_token`: a scraper that negotiates UTF-8 names sees them as they are,
a classic one as gen_ai_server_time_to_first_token). OpenTelemetry instrument names cannot hold a
colon, so over OTLP the `specdec:` prefix reads `specdec.`. Each Metrics has its own registry (no
process-wide state) and, when neither backend is on, hands out no-op instruments.
"""
from __future__ import annotations

from typing import Callable

SPEC_DECODE_NUM_DRAFTS = "specdec:spec_decode_num_drafts"
SPEC_DECODE_NUM_DRAFT_TOKENS = "specdec:spec_decode_num_draft_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS = "specdec:spec_decode_num_accepted_tokens"
SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS = "specdec:spec_decode_num_accepted_tokens_per_pos"
TIME_TO_FIRST_TOKEN = "gen_ai.server.time_to_first_token"
TIME_PER_OUTPUT_TOKEN = "gen_ai.server.time_per_output_token"
NUM_REQUESTS_WAITING = "specdec:num_requests_waiting"
NUM_REQUESTS_RUNNING = "specdec:num_requests_running"
KV_CAPACITY_TOKENS = "specdec:kv_cache_capacity_tokens"
KV_RESERVED_TOKENS = "specdec:kv_cache_reserved_tokens"
KV_USED_TOKENS = "specdec:kv_cache_used_tokens"
VERIFY_BATCH_SIZE = "specdec:verify_batch_size"
NODE_BUDGET = "specdec:spec_decode_node_budget"
VERIFY_TIME = "specdec:verify_step_seconds"
PREFILL_TIME = "specdec:prefill_seconds"
DRAFT_TIME = "specdec:draft_seconds"
DRAFT_NUM_SENT = "specdec:draft_num_sent"
DRAFT_NUM_PIPELINED = "specdec:draft_num_pipelined_sent"

_LATENCY_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
              10.0, 20.0, 40.0, 80.0)
_SIZES = (0, 1, 2, 4, 8, 16, 32, 64, 128)
# name -> (kind, description, label names, buckets)
SPECS = {
    SPEC_DECODE_NUM_DRAFTS: ("counter", "Verify steps that verified a draft", (), None),
    SPEC_DECODE_NUM_DRAFT_TOKENS: ("counter", "Draft tokens (tree nodes) verified", (), None),
    SPEC_DECODE_NUM_ACCEPTED_TOKENS: ("counter", "Draft tokens accepted", (), None),
    SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS: (
        "counter", "Steps whose draft token at this position (0 = first) was accepted", ("position",), None),
    TIME_TO_FIRST_TOKEN: ("histogram", "Seconds from the request's arrival to its first token", (), _LATENCY_S),
    TIME_PER_OUTPUT_TOKEN: ("histogram", "Seconds per output token after the first, per request", (), _LATENCY_S),
    NUM_REQUESTS_WAITING: ("gauge", "Requests waiting in the queue", (), None),
    NUM_REQUESTS_RUNNING: ("gauge", "Requests (router) or sequences (workers) running", (), None),
    KV_CAPACITY_TOKENS: ("gauge", "KV cache tokens the target(s) may hold", (), None),
    KV_RESERVED_TOKENS: ("gauge", "KV cache tokens reserved by running sequences", (), None),
    KV_USED_TOKENS: ("gauge", "KV cache tokens held in sequences' contexts", (), None),
    VERIFY_BATCH_SIZE: ("histogram", "Sequences per verify forward", (), _SIZES),
    NODE_BUDGET: ("histogram", "Draft nodes the load-aware policy allows a sequence's next step", (), _SIZES),
    VERIFY_TIME: ("histogram", "Seconds per verify step (forward, verdicts, commit)", (), _LATENCY_S),
    PREFILL_TIME: ("histogram", "Seconds per prompt prefill", (), _LATENCY_S),
    DRAFT_TIME: ("histogram", "Seconds per draft", (), _LATENCY_S),
    DRAFT_NUM_SENT: ("counter", "Drafts sent to target workers", (), None),
    DRAFT_NUM_PIPELINED: ("counter", "Drafts sent that were drafted ahead (pipelined) and used", (), None),
}


class _Instrument:
    """Records into Prometheus and/or OpenTelemetry; the no-op one (both None) records nothing."""

    def __init__(self, prometheus=None, otel=None, labelled: bool = False):
        self.prometheus, self.otel, self.labelled = prometheus, otel, labelled

    def add(self, value: float, **labels) -> None:
        if self.prometheus is not None:
            (self.prometheus.labels(**labels) if self.labelled else self.prometheus).inc(value)
        if self.otel is not None:
            self.otel.add(value, labels)

    def observe(self, value: float) -> None:
        if self.prometheus is not None:
            self.prometheus.observe(value)
        if self.otel is not None:
            self.otel.record(value)


_NOOP = _Instrument()


class Metrics:
    def __init__(self, prometheus: bool = False, meter=None):
        from prometheus_client import CollectorRegistry

        self.registry = CollectorRegistry(auto_describe=True) if prometheus else None
        self.meter = meter
        self.address = ""  # host:port of the Prometheus endpoint once served
        self._server = None

    @property
    def enabled(self) -> bool:
        return self.registry is not None or self.meter is not None

    def counter(self, name: str) -> _Instrument:
        return self._make(name, "counter")

    def histogram(self, name: str) -> _Instrument:
        return self._make(name, "histogram")

    def gauge(self, name: str, read: Callable[[], float]) -> None:
        """A value read when scraped or exported (queue length, KV tokens): nothing to update."""
        kind, description, _, _ = SPECS[name]
        assert kind == "gauge", name
        if self.registry is not None:
            from prometheus_client import Gauge

            Gauge(name, description, registry=self.registry).set_function(read)
        if self.meter is not None:
            from opentelemetry.metrics import Observation

            self.meter.create_observable_gauge(_otel_name(name), [lambda options: [Observation(read())]],
                                               description=description)

    def _make(self, name: str, kind: str) -> _Instrument:
        spec_kind, description, labels, buckets = SPECS[name]
        assert spec_kind == kind, name
        if not self.enabled:
            return _NOOP
        prometheus = otel = None
        if self.registry is not None:
            from prometheus_client import Counter, Histogram

            prometheus = (Counter(name, description, labels, registry=self.registry) if kind == "counter" else
                          Histogram(name, description, labels, registry=self.registry, buckets=buckets))
        if self.meter is not None:
            unit = "s" if buckets is _LATENCY_S else ""
            otel = (self.meter.create_counter(_otel_name(name), unit, description) if kind == "counter" else
                    self.meter.create_histogram(_otel_name(name), unit, description,
                                                explicit_bucket_boundaries_advisory=buckets))
        return _Instrument(prometheus, otel, labelled=bool(labels))

    def serve(self, port: int, host: str = "127.0.0.1") -> str:
        """GET http://host:port/metrics (Prometheus text format); returns host:port."""
        from prometheus_client import start_http_server

        from specdec.errors import InvalidArgument

        try:
            self._server, _ = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise InvalidArgument(f"cannot serve metrics on {host}:{port}: {exc.strerror or exc}") from exc
        self.address = f"{host}:{self._server.server_port}"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def _otel_name(name: str) -> str:
    return name.replace(":", ".")


class SpecDecodeCounters:
    """The vLLM-compatible speculative counters, fed one step (commit) at a time."""

    def __init__(self, metrics: Metrics):
        self.drafts = metrics.counter(SPEC_DECODE_NUM_DRAFTS)
        self.draft_tokens = metrics.counter(SPEC_DECODE_NUM_DRAFT_TOKENS)
        self.accepted = metrics.counter(SPEC_DECODE_NUM_ACCEPTED_TOKENS)
        self.per_pos = metrics.counter(SPEC_DECODE_NUM_ACCEPTED_TOKENS_PER_POS)
        self.enabled = metrics.enabled

    def record(self, num_drafted: int, num_accepted: int) -> None:
        if not self.enabled or not num_drafted:
            return
        self.drafts.add(1)
        self.draft_tokens.add(num_drafted)
        self.accepted.add(num_accepted)
        for position in range(num_accepted):  # the accepted path is a prefix of the draft
            self.per_pos.add(1, position=str(position))
