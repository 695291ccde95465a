"""The spans and metrics of generations, as the router, the target worker and the draft worker
make them (names in specdec.telemetry, instruments in specdec.telemetry_metrics).

Step spans are stamped after the step from its time.monotonic() readings (see specdec.telemetry),
and only for steps `StepSampling` keeps; nothing here runs in a decode loop while tracing is off.
"""
from __future__ import annotations

import time
from contextlib import contextmanager

from specdec import telemetry as t
from specdec.telemetry_metrics import (DRAFT_NUM_PIPELINED, DRAFT_NUM_SENT, DRAFT_TIME, KV_CAPACITY_TOKENS,
                                       KV_RESERVED_TOKENS, KV_USED_TOKENS, NODE_BUDGET, NUM_REQUESTS_RUNNING,
                                       NUM_REQUESTS_WAITING, PREFILL_TIME, TIME_PER_OUTPUT_TOKEN, TIME_TO_FIRST_TOKEN,
                                       VERIFY_BATCH_SIZE, VERIFY_TIME, SpecDecodeCounters)



class RouterInstruments:
    """The router's metrics, created once per process; admission: router.admission.Admission (its
    counts and figures are read when scraped)."""

    def __init__(self, metrics, admission):
        self.spec = SpecDecodeCounters(metrics)
        self.ttft = metrics.histogram(TIME_TO_FIRST_TOKEN)
        self.tpot = metrics.histogram(TIME_PER_OUTPUT_TOKEN)
        metrics.gauge(NUM_REQUESTS_WAITING, lambda: admission.counts()[1])
        metrics.gauge(NUM_REQUESTS_RUNNING, lambda: admission.counts()[0])
        metrics.gauge(KV_CAPACITY_TOKENS, lambda: admission.figures().kv_capacity_tokens)
        metrics.gauge(KV_RESERVED_TOKENS, lambda: admission.figures().kv_reserved_tokens)


class RequestTrace:
    """One generation at the router: its span (when traced), time to first token and time per output
    token, and the speculative counters, fed commit by commit. The span is never made current across
    the generator's yields; calls that need it as parent get it explicitly (`use`, `metadata`)."""

    def __init__(self, telemetry: t.Telemetry, instruments: RouterInstruments, operation: str, model: str,
                 params, num_input_tokens: int):
        self.telemetry, self.instruments = telemetry, instruments
        self.start = time.monotonic()
        self.first_token_at: float | None = None
        self.num_tokens = 0
        self.span = telemetry.start_span(f"{operation} {model}", attributes={
            t.GEN_AI_OPERATION: operation, t.GEN_AI_SYSTEM: "specdec", t.GEN_AI_MODEL: model,
            t.GEN_AI_MAX_TOKENS: params.max_new_tokens, t.GEN_AI_TEMPERATURE: params.temperature,
            t.GEN_AI_TOP_P: params.top_p, t.GEN_AI_INPUT_TOKENS: num_input_tokens})

    @contextmanager
    def queue(self):
        """Around admission: a child span covering the wait in the fair queue."""
        start = time.monotonic()
        if self.span is None:
            yield
            return
        with self.telemetry.span(t.SPAN_QUEUE, parent=self._context()):
            yield
        self.span.set_attribute(t.QUEUE_S, time.monotonic() - start)

    def admitted(self, target: str, draft: str) -> None:
        if self.span is not None:
            self.span.set_attributes({t.TARGET: target, t.DRAFT_WORKER: draft})

    def metadata(self) -> tuple:
        """gRPC metadata carrying this request's trace context (for the target's Admit stream)."""
        return self.telemetry.outgoing_metadata(self.span)

    @contextmanager
    def use(self):
        """Make the request span current for a blocking call (Attach: the gRPC interceptor reads it)."""
        if self.span is None:
            yield
            return
        from opentelemetry import trace

        with trace.use_span(self.span, end_on_exit=False):
            yield

    def commit(self, num_tokens: int, num_drafted: int, num_accepted: int) -> None:
        if num_tokens and self.first_token_at is None:
            self.first_token_at = time.monotonic()
            self.instruments.ttft.observe(self.first_token_at - self.start)
        self.num_tokens += num_tokens
        self.instruments.spec.record(num_drafted, num_accepted)

    def finish(self, stats, finish_reason: str) -> None:
        if self.num_tokens > 1 and self.first_token_at is not None:
            self.instruments.tpot.observe((time.monotonic() - self.first_token_at) / (self.num_tokens - 1))
        if self.span is not None:
            self.span.set_attributes({
                t.GEN_AI_OUTPUT_TOKENS: stats.num_new_tokens, t.GEN_AI_FINISH_REASONS: [finish_reason],
                t.NUM_TARGET_FORWARDS: stats.num_target_forwards, t.NUM_DRAFT_TOKENS: stats.num_draft_tokens,
                t.NUM_ACCEPTED_TOKENS: stats.num_accepted_tokens})

    def end(self, error: BaseException | None = None) -> None:
        if self.span is None:
            return
        if error is not None:
            from opentelemetry.trace import Status, StatusCode

            self.span.record_exception(error)
            self.span.set_status(Status(StatusCode.ERROR, f"{type(error).__name__}: {error}"))
        self.span.end()

    def _context(self):
        from opentelemetry import trace

        return trace.set_span_in_context(self.span)


class TargetInstruments:
    """The target worker's metrics, created once per process. kv_figures() -> its KvFigures (gauges)."""

    def __init__(self, metrics, kv_figures):
        self.spec = SpecDecodeCounters(metrics)
        self.batch_size = metrics.histogram(VERIFY_BATCH_SIZE)
        self.verify_s = metrics.histogram(VERIFY_TIME)
        self.prefill_s = metrics.histogram(PREFILL_TIME)
        self.node_budget = metrics.histogram(NODE_BUDGET)
        self.enabled = metrics.enabled
        metrics.gauge(NUM_REQUESTS_RUNNING, lambda: kv_figures().num_sequences)
        metrics.gauge(KV_CAPACITY_TOKENS, lambda: kv_figures().capacity_tokens)
        metrics.gauge(KV_RESERVED_TOKENS, lambda: kv_figures().reserved_tokens)
        metrics.gauge(KV_USED_TOKENS, lambda: kv_figures().used_tokens)

    def step(self, batch_size: int, seconds: float, results) -> None:
        """One verify forward; results: StepResults (objects with num_drafted, num_accepted) or failures."""
        if not self.enabled:
            return
        self.batch_size.observe(batch_size)
        self.verify_s.observe(seconds)
        for result in results:
            if hasattr(result, "num_accepted"):
                self.spec.record(result.num_drafted, result.num_accepted)


class TargetStepTrace:
    """One decode step of the target worker, for its spans: begun under the worker's lock once the
    budgets are planned (what each sequence waited since, its draft's context, its node budget),
    finished after the commits were published."""

    def __init__(self, telemetry: t.Telemetry, picked, planned: dict):
        from specdec.policy import NO_CAP

        self.telemetry = telemetry
        self.start = time.monotonic()
        # per picked sequence: (parent context, its last commit published at, its draft's arrival or None,
        # the draft span's context or None, node budget)
        self.seqs = [(state.trace_parent, state.version_since, state.draft_at if tree is not None else None,
                      state.draft_trace if tree is not None else None, planned.get(seq_id, NO_CAP))
                     for seq_id, state, tree in picked]
        self.no_cap = NO_CAP

    def finish(self, entries, trees, results, times) -> None:
        """entries: the step's Drafting entries; trees: as verified; results: StepResult or failure;
        times: specdec.step.StepTimes of the verify."""
        end = time.monotonic()
        steps = self.telemetry.steps
        batch_rows = len(trees) * (1 + max((tree.num_nodes for tree in trees), default=0))
        for (parent, since, arrived, draft_trace, budget), entry, tree, result in zip(self.seqs, entries, trees,
                                                                                    results):
            if parent is None or not hasattr(result, "num_accepted"):
                continue
            number, last = entry.seq.version, entry.seq.finish_reason is not None
            if not steps.keeps(number, end - self.start, last):
                continue
            source = "in_target" if entry.drafted is not None else "draft_worker" if arrived is not None else "none"
            if entry.drafted is not None:  # drafted here, in the target
                start, seconds, depth, nodes = entry.drafted
                self.telemetry.emit(t.SPAN_DRAFT, parent, start, start + seconds, lambda: {
                    t.STEP: number, t.SEQUENCE_VERSION: number - 1, t.DRAFT_DEPTH: depth, t.DRAFT_NODES: nodes,
                    t.DRAFT_SOURCE: source})

            def attributes():  # built only if the span is recorded
                out = {t.STEP: number, t.SEQUENCE_VERSION: number - 1, t.BATCH_SIZE: len(trees),
                       t.BATCH_ROWS: batch_rows, t.VERIFY_ROWS: 1 + tree.num_nodes, t.NODES_VERIFIED: tree.num_nodes,
                       t.NODES_ACCEPTED: result.num_accepted, t.NUM_TOKENS: len(result.token_ids),
                       t.FORWARD_S: times.forward_end - times.start, t.COMMIT_S: end - times.forward_end,
                       t.QUEUE_S: max(self.start - (arrived or since), 0.0), t.DRAFT_SOURCE: source}
                if arrived is not None:
                    out[t.TURNAROUND_S] = max(arrived - since, 0.0)
                if budget < self.no_cap:
                    out[t.NODE_BUDGET] = budget
                return out

            self.telemetry.emit(t.SPAN_VERIFY, parent, times.start, end, attributes,
                                self.telemetry.links_from(draft_trace))


class DraftInstruments:
    """The draft worker's metrics, created once per process; num_sequences() -> sequences held."""

    def __init__(self, metrics, num_sequences):
        self.num_sent = metrics.counter(DRAFT_NUM_SENT)
        self.num_pipelined = metrics.counter(DRAFT_NUM_PIPELINED)
        self.draft_s = metrics.histogram(DRAFT_TIME)
        metrics.gauge(NUM_REQUESTS_RUNNING, num_sequences)

    def sent(self, seconds: float, pipelined: bool) -> None:
        self.num_sent.add(1)
        self.draft_s.observe(seconds)
        if pipelined:
            self.num_pipelined.add(1)


def draft_span(telemetry: t.Telemetry, parent, step: int, start: float, seconds: float, depth: int, nodes: int,
               pipelined: bool) -> dict:
    """The draft worker's span for the draft of `step`, if that step is traced; returns its context
    as W3C headers for DraftMessage.trace_context ({} when not traced)."""
    if parent is None or not telemetry.steps.keeps(step, seconds):
        return {}
    span = telemetry.emit(t.SPAN_DRAFT, parent, start, start + seconds, lambda: {
        t.STEP: step, t.SEQUENCE_VERSION: step - 1, t.DRAFT_DEPTH: depth, t.DRAFT_NODES: nodes,
        t.DRAFT_PIPELINED: pipelined, t.DRAFT_SOURCE: "draft_worker"})
    return telemetry.context_map(span)
