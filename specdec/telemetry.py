"""OpenTelemetry for the serving processes: setup, the names of spans and attributes, and the few
calls the services make.

Tracing is configured only by the standard variables: `OTEL_TRACES_EXPORTER` (otlp, console, none,
or otlp_file, see specdec.telemetry_export), `OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT` / `_PROTOCOL`,
`OTEL_SERVICE_NAME`, `OTEL_TRACES_SAMPLER[_ARG]`, `OTEL_PROPAGATORS`, `OTEL_BSP_*`, `OTEL_SDK_DISABLED`.
With none set, a process has no tracer at all: `Telemetry.tracing` is False and the decode loops
skip every span call (they record a few clock readings, nothing else).

Per decode step a draft span and a verify span are made *after* the step, from clock readings taken
during it (explicit start and end times). That keeps the step itself free of span bookkeeping, lets
one batched forward give each request its own verify span, and lets `SPECDEC_TRACE_STEPS` decide
with the step's duration in hand which steps are worth a span (`StepSampling`).

One trace per request: the router's request span -> gRPC metadata (W3C traceparent) -> the target's
Admit and the draft worker's Attach server spans (opentelemetry-instrumentation-grpc) -> prefill,
draft and verify spans. The Verify stream serves many requests, so each DraftMessage carries its
own draft span's context (`trace_context`), and the verify span links to it.
"""
from __future__ import annotations

import os
import time
from contextlib import nullcontext
from dataclasses import dataclass

from specdec.errors import InvalidArgument

# Span names.
SPAN_QUEUE = "specdec.queue"  # router: waiting in the fair queue until admission grants a target
SPAN_PREFILL = "specdec.prefill"  # target: the prompt's forward
SPAN_DRAFT = "specdec.draft"  # draft worker or in-target drafter: one step's draft
SPAN_VERIFY = "specdec.verify"  # target: one step of one sequence (a batched forward gives one per sequence)

# Attributes: OpenTelemetry GenAI semantic conventions where one exists ...
GEN_AI_OPERATION = "gen_ai.operation.name"
GEN_AI_MODEL = "gen_ai.request.model"
GEN_AI_MAX_TOKENS = "gen_ai.request.max_tokens"
GEN_AI_TEMPERATURE = "gen_ai.request.temperature"
GEN_AI_TOP_P = "gen_ai.request.top_p"
GEN_AI_INPUT_TOKENS = "gen_ai.usage.input_tokens"
GEN_AI_OUTPUT_TOKENS = "gen_ai.usage.output_tokens"
GEN_AI_FINISH_REASONS = "gen_ai.response.finish_reasons"
GEN_AI_SYSTEM = "gen_ai.provider.name"
# ... and `specdec.` for the rest.
SEQUENCE_ID = "specdec.sequence_id"
STEP = "specdec.step"  # 1, 2, ...: the verify step of the sequence (= its version after the step)
SEQUENCE_VERSION = "specdec.sequence.version"  # the version the step verified on
TARGET = "specdec.target"  # router: the target worker chosen
DRAFT_WORKER = "specdec.draft_worker"  # router: the draft worker assigned ("" = none)
QUEUE_S = "specdec.queue_s"  # router: fair-queue wait; target: waited ready before its step began
# target: from publishing the previous commit to this step's draft arriving from the draft worker (its
# drafting plus both ways on the wire); measured on the target's clock alone
TURNAROUND_S = "specdec.draft.turnaround_s"
BATCH_SIZE = "specdec.batch.size"  # sequences in the verify forward
BATCH_ROWS = "specdec.batch.rows"  # rows of the padded forward (sequences x most rows)
VERIFY_ROWS = "specdec.verify.rows"  # this sequence's rows: root + nodes
NODES_VERIFIED = "specdec.verify.nodes"
NODES_ACCEPTED = "specdec.verify.accepted"
NUM_TOKENS = "specdec.verify.tokens"  # tokens the step committed
NODE_BUDGET = "specdec.policy.node_budget"  # the load-aware policy's node budget for this step
FORWARD_S = "specdec.verify.forward_s"  # forward and verdicts
COMMIT_S = "specdec.verify.commit_s"  # KV commit, sequence commit, commit messages
DRAFT_SOURCE = "specdec.draft.source"  # draft_worker | in_target | none
DRAFT_DEPTH = "specdec.draft.depth"
DRAFT_NODES = "specdec.draft.nodes"
DRAFT_PIPELINED = "specdec.draft.pipelined"  # drafted ahead, before the previous step's commit
PROCESS = "specdec.process"  # resource attribute: router | target | draft
NUM_TARGET_FORWARDS = "specdec.num_target_forwards"
NUM_DRAFT_TOKENS = "specdec.num_draft_tokens"
NUM_ACCEPTED_TOKENS = "specdec.num_accepted_tokens"

STEPS_ENV = "SPECDEC_TRACE_STEPS"
DEFAULT_STEPS = "every:16,over:500"
_TRACED_METHODS = ("Generate", "Admit", "Attach", "Release")  # gRPC methods that get spans


@dataclass(frozen=True)
class StepSampling:
    """Which decode steps get draft and verify spans: `SPECDEC_TRACE_STEPS`, comma-separated rules, a
    step is kept when any keeps it: `all`; `none`; `every:N` (steps 1, N + 1, 2N + 1, ... and the
    last); `over:MS` (steps whose span lasts more than MS milliseconds). Default every:16,over:500, so
    a long generation gives a few dozen step spans, plus every slow step. The request's own spans
    (request, queue, prefill) are always made when its trace is sampled (OTEL_TRACES_SAMPLER)."""

    every: int = 0  # 0: no every-N rule
    over_s: float | None = None

    @classmethod
    def parse(cls, text: str) -> StepSampling:
        every, over_s = 0, None
        for rule in filter(None, (r.strip() for r in text.split(","))):
            name, _, value = rule.partition(":")
            try:
                if name == "all" and not value:
                    every = 1
                elif name == "none" and not value:
                    continue
                elif name == "every" and int(value) >= 1:
                    every = int(value)
                elif name == "over" and float(value) >= 0:
                    over_s = float(value) / 1000.0
                else:
                    raise ValueError(rule)
            except ValueError:
                raise InvalidArgument(f"{STEPS_ENV}={text!r}: each rule must be all, none, every:N (N >= 1) "
                                      f"or over:MS (milliseconds >= 0), comma-separated") from None
        return cls(every, over_s)

    def keeps(self, step: int, duration_s: float, last: bool = False) -> bool:
        if self.every and ((step - 1) % self.every == 0 or last):
            return True
        return self.over_s is not None and duration_s > self.over_s


class Telemetry:
    """One process's telemetry. `tracer_provider` None: tracing off, every span helper a no-op. `metrics`:
    specdec.telemetry_metrics.Metrics (no-op instruments when neither Prometheus nor OTLP is on)."""

    def __init__(self, tracer_provider=None, steps: StepSampling = StepSampling(), metrics=None, shutdowns=()):
        from specdec.telemetry_metrics import Metrics

        self.tracer_provider = tracer_provider
        self.tracer = tracer_provider.get_tracer("specdec") if tracer_provider is not None else None
        self.tracing = tracer_provider is not None
        self.steps = steps
        self.metrics = metrics if metrics is not None else Metrics()
        self._shutdowns = tuple(shutdowns)
        # wall-clock ns of a time.monotonic() reading: spans are stamped from the steps' own clock readings
        self._anchor_ns, self._anchor_mono = time.time_ns(), time.monotonic()

    @classmethod
    def off(cls) -> Telemetry:
        return cls()

    def wall_ns(self, monotonic_s: float) -> int:
        return self._anchor_ns + int((monotonic_s - self._anchor_mono) * 1e9)

    def shutdown(self) -> None:
        """Export what is buffered and stop (at the server's stop, so no span is lost)."""
        for stop in self._shutdowns:
            stop()

    # -- gRPC --------------------------------------------------------------------------------
    def server_interceptors(self) -> list:
        """Server spans for Generate / Admit / Attach / Release, parented by the caller's traceparent."""
        if not self.tracing:
            return []
        from opentelemetry.instrumentation.grpc import filters, server_interceptor

        return [server_interceptor(self.tracer_provider,
                                   filter_=filters.any_of(*map(filters.method_name, _TRACED_METHODS)))]

    def traced_channel(self, channel):
        """Client spans and traceparent for unary calls (Attach, Release). Admit, a server stream the
        router must be able to cancel, gets its traceparent by hand (`outgoing_metadata`)."""
        if not self.tracing:
            return channel
        from opentelemetry.instrumentation.grpc import client_interceptor, filters
        from opentelemetry.instrumentation.grpc.grpcext import intercept_channel

        unary = filters.all_of(filters.any_of(*map(filters.method_name, _TRACED_METHODS)),
                               filters.negate(filters.method_name("Admit")))
        return intercept_channel(channel, client_interceptor(self.tracer_provider, filter_=unary))

    def outgoing_metadata(self, span) -> tuple:
        """gRPC metadata carrying `span`'s context (W3C traceparent); () when tracing is off."""
        return tuple(self.context_map(span).items())

    # -- context -------------------------------------------------------------------------------
    def current_context(self):
        """The active context (a server span's, inside a traced handler); None when tracing is off."""
        if not self.tracing:
            return None
        from opentelemetry import context

        return context.get_current()

    def context_map(self, span) -> dict:
        """`span`'s context as W3C headers (for DraftMessage.trace_context / metadata)."""
        if span is None or not self.tracing:
            return {}
        from opentelemetry import propagate, trace

        carrier: dict = {}
        propagate.inject(carrier, context=trace.set_span_in_context(span))
        return carrier

    def links_from(self, carrier) -> list:
        """A span link to the span whose context `carrier` holds ([] if none)."""
        if not carrier or not self.tracing:
            return []
        from opentelemetry import propagate, trace

        span_context = trace.get_current_span(propagate.extract(dict(carrier))).get_span_context()
        return [trace.Link(span_context)] if span_context.is_valid else []

    # -- spans -----------------------------------------------------------------------------------
    def span(self, name: str, parent=None, attributes: dict | None = None):
        """A live span (context manager yielding it, or None when off); parent None = current context."""
        if not self.tracing:
            return nullcontext()
        return self.tracer.start_as_current_span(name, context=parent, attributes=attributes)

    def start_span(self, name: str, parent=None, attributes: dict | None = None):
        """A span the caller ends (None when off): for spans that outlive one block, like a request
        served by a generator, which must not stay attached to a thread's context across yields."""
        if not self.tracing:
            return None
        return self.tracer.start_span(name, context=parent, attributes=attributes)

    def emit(self, name: str, parent, start_s: float, end_s: float, attributes, links=()):
        """A finished span stamped from time.monotonic() readings (made after the fact). attributes: a
        dict or a function making one, called only if the span is recorded (its trace is sampled).
        Returns the span, or None when it was not recorded."""
        span = self.tracer.start_span(name, context=parent, links=list(links), start_time=self.wall_ns(start_s))
        recorded = span.is_recording()
        if recorded:
            span.set_attributes(attributes() if callable(attributes) else attributes)
        span.end(end_time=self.wall_ns(max(end_s, start_s)))
        return span if recorded else None


def setup(process: str, metrics_port: int = -1, host: str = "127.0.0.1") -> Telemetry:
    """Telemetry of one serving process (router, target or draft), from the OTEL_* variables; the
    Prometheus endpoint on host:metrics_port when it is >= 0 (0 = any free port)."""
    from specdec.telemetry_export import build_providers
    from specdec.telemetry_metrics import Metrics

    steps = StepSampling.parse(os.environ.get(STEPS_ENV, DEFAULT_STEPS))
    tracer_provider, meter_provider, shutdowns = build_providers(process)
    metrics = Metrics(prometheus=metrics_port >= 0, meter=meter_provider.get_meter("specdec")
                      if meter_provider is not None else None)
    if metrics_port >= 0:
        metrics.serve(metrics_port, host)
        shutdowns = (*shutdowns, metrics.stop)
    return Telemetry(tracer_provider, steps, metrics, shutdowns)
