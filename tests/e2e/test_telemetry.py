"""Tracing and metrics through the real stack (router, draft worker, target worker as processes).

Every process exports its spans twice, configured by the OTEL_* variables alone: to an OTLP JSON file
(`otlp_file`) and over OTLP/gRPC to a real receiver on 127.0.0.1 (tests/e2e/otlp_receiver.py). Each
server's Prometheus endpoint is scraped with a plain HTTP GET and read with prometheus_client's parser.
"""
from __future__ import annotations

import dataclasses
import json
import time
import urllib.request
from types import SimpleNamespace

import pytest
from prometheus_client.parser import text_string_to_metric_families

from specdec import telemetry as t
from specdec.cli import main as cli_main
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.trace_report import read_spans
from e2e.harness import always_drafting, running_stack, stack_config
from e2e.otlp_receiver import otlp_receiver

pytestmark = pytest.mark.e2e
SPAN_WAIT_S = 30.0


@pytest.fixture(scope="module")
def traced(tiny_models, tmp_path_factory):
    spans_file = tmp_path_factory.mktemp("spans") / "spans.jsonl"
    config = always_drafting(stack_config(tiny_models, "draft"))  # the figures below need accepted drafts
    config = dataclasses.replace(
        config, router=dataclasses.replace(config.router, metrics_port=0),
        targets=tuple(dataclasses.replace(c, metrics_port=0) for c in config.targets),
        drafts=tuple(dataclasses.replace(c, metrics_port=0) for c in config.drafts))
    with otlp_receiver() as (receiver, address):
        env = {"OTEL_TRACES_EXPORTER": "otlp,otlp_file", "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://{address}",
               "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc", "SPECDEC_TRACES_FILE": str(spans_file),
               "OTEL_BSP_SCHEDULE_DELAY": "100", "SPECDEC_TRACE_STEPS": "all"}
        with running_stack(config, env) as stack:
            yield SimpleNamespace(stack=stack, receiver=receiver, spans_file=spans_file)


def generate(stack, max_new_tokens: int, prompt: str = "The quick brown fox"):
    with Client(stack.address) as client:
        return client.generate(prompt, SamplingParams(max_new_tokens=max_new_tokens, ignore_eos=True), timeout_s=60)


def request_trace(load_spans, max_new_tokens: int, num_steps: int) -> list:
    """The spans of the one request that asked for max_new_tokens, once all its steps are exported."""
    deadline = time.monotonic() + SPAN_WAIT_S
    while True:
        spans = load_spans()
        roots = [s for s in spans if s.attributes.get(t.GEN_AI_MAX_TOKENS) == max_new_tokens]
        if len(roots) == 1:
            trace = [s for s in spans if s.trace_id == roots[0].trace_id]
            steps = {s.attributes[t.STEP] for s in trace if s.name == t.SPAN_VERIFY}
            # each process exports on its own schedule: the draft spans the verifies link to may come last
            linked = {span_id for s in trace if s.name == t.SPAN_VERIFY for _, span_id in s.links}
            if steps == set(range(1, num_steps + 1)) and any(s.name.endswith("/Release") for s in trace) \
                    and linked <= {s.span_id for s in trace}:
                return trace
        assert len(roots) <= 1 and time.monotonic() < deadline, f"spans of the request did not all arrive: {roots}"
        time.sleep(0.2)


def test_one_request_is_one_trace_across_three_processes(traced, reference):
    out = generate(traced.stack, 23)
    # tracing every step changes no output: the in-process engine's tokens (no tracing there)
    assert out.token_ids == reference("draft", "The quick brown fox", SamplingParams(max_new_tokens=23,
                                                                                     ignore_eos=True)).token_ids
    trace = request_trace(lambda: read_spans(traced.spans_file) if traced.spans_file.exists() else [], 23,
                          out.stats.num_target_forwards)
    assert {s.process for s in trace} == {"router", "target", "draft"}
    by_id = {s.span_id: s for s in trace}
    [root] = [s for s in trace if not s.parent_id]
    assert (root.process, root.name) == ("router", "/specdec.v1.Generation/Generate")
    assert all(s.parent_id in by_id for s in trace if s is not root)

    def only(name, process):
        [span] = [s for s in trace if s.name == name and s.process == process]
        return span

    request = only("text_completion target", "router")
    assert request.parent_id == root.span_id
    assert only(t.SPAN_QUEUE, "router").parent_id == request.span_id
    admit = only("/specdec.v1.TargetWorker/Admit", "target")
    assert admit.parent_id == request.span_id  # traceparent put in the Admit stream's metadata by hand
    assert only(t.SPAN_PREFILL, "target").parent_id == admit.span_id
    attach = only("/specdec.v1.DraftWorker/Attach", "draft")
    assert by_id[attach.parent_id].process == "router" and by_id[attach.parent_id].parent_id == request.span_id

    a = request.attributes
    assert (a[t.GEN_AI_OPERATION], a[t.GEN_AI_MODEL], a[t.GEN_AI_MAX_TOKENS]) == ("text_completion", "target", 23)
    assert (a[t.GEN_AI_TEMPERATURE], a[t.GEN_AI_TOP_P]) == (0.0, 1.0)
    assert a[t.GEN_AI_INPUT_TOKENS] == len(out.prompt_token_ids)
    assert a[t.GEN_AI_OUTPUT_TOKENS] == out.stats.num_new_tokens == 23
    assert a[t.GEN_AI_FINISH_REASONS] == ["length"]

    verifies = sorted((s for s in trace if s.name == t.SPAN_VERIFY), key=lambda s: s.attributes[t.STEP])
    assert [s.attributes[t.STEP] for s in verifies] == list(range(1, out.stats.num_target_forwards + 1))
    assert all(s.parent_id == admit.span_id and s.process == "target" for s in verifies)
    for span in verifies:
        for name in (t.BATCH_SIZE, t.BATCH_ROWS, t.VERIFY_ROWS, t.SEQUENCE_VERSION, t.FORWARD_S, t.COMMIT_S,
                     t.QUEUE_S, t.DRAFT_SOURCE):
            assert name in span.attributes, (name, span.attributes)
        assert span.attributes[t.SEQUENCE_VERSION] == span.attributes[t.STEP] - 1
        assert span.attributes[t.VERIFY_ROWS] == 1 + span.attributes[t.NODES_VERIFIED]
    assert sum(s.attributes[t.NODES_VERIFIED] for s in verifies) == out.stats.num_draft_tokens
    assert sum(s.attributes[t.NODES_ACCEPTED] for s in verifies) == out.stats.num_accepted_tokens
    assert sum(s.attributes[t.NUM_TOKENS] for s in verifies) == out.stats.num_new_tokens

    drafts = {s.span_id: s for s in trace if s.name == t.SPAN_DRAFT}
    assert drafts and all(d.parent_id == attach.span_id and d.process == "draft" for d in drafts.values())
    linked = [s for s in verifies if s.links]
    assert linked, "no verify span links to the draft it verified"
    for span in linked:  # the DraftMessage carried its draft span's context, per sequence
        [(trace_id, span_id)] = span.links
        assert trace_id == span.trace_id and drafts[span_id].attributes[t.STEP] == span.attributes[t.STEP]
        assert span.attributes[t.DRAFT_SOURCE] == "draft_worker" and t.TURNAROUND_S in span.attributes


def test_otlp_receiver_gets_the_spans_of_a_request(traced):
    out = generate(traced.stack, 17, "Once upon a time")
    received = request_trace(traced.receiver.spans, 17, out.stats.num_target_forwards)
    in_file = request_trace(lambda: read_spans(traced.spans_file), 17, out.stats.num_target_forwards)
    assert {s.span_id for s in received} == {s.span_id for s in in_file}
    assert {s.process for s in received} == {"router", "target", "draft"}


def scrape(address: str) -> dict:
    """{sample name + sorted labels: value} from GET http://address/metrics."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as response:
        text = response.read().decode()
    return {(sample.name, tuple(sorted(sample.labels.items()))): sample.value
            for family in text_string_to_metric_families(text) for sample in family.samples}


def delta(after: dict, before: dict, name: str, **labels) -> float:
    key = (name, tuple(sorted(labels.items())))
    return after.get(key, 0.0) - before.get(key, 0.0)


def test_prometheus_counters_agree_with_generation_stats(traced):
    stack = traced.stack
    assert stack.router.metrics_address and stack.targets[0].metrics_address and stack.drafts[0].metrics_address
    servers = {"router": stack.router.metrics_address, "target": stack.targets[0].metrics_address}
    before = {name: scrape(address) for name, address in servers.items()}
    out = generate(stack, 31, "Write a list of fruits: apple, banana, cherry, apple, banana")
    stats = out.stats
    assert sum(stats.num_accepted_per_pos) == stats.num_accepted_tokens > 0
    assert list(stats.num_accepted_per_pos) == sorted(stats.num_accepted_per_pos, reverse=True)
    time.sleep(0.5)  # the target publishes its last commit's figures just after sending it
    for name, address in servers.items():
        after = scrape(address)
        assert delta(after, before[name], "specdec:spec_decode_num_drafts_total") == stats.num_drafts > 0
        assert delta(after, before[name], "specdec:spec_decode_num_draft_tokens_total") == stats.num_draft_tokens
        assert delta(after, before[name], "specdec:spec_decode_num_accepted_tokens_total") == stats.num_accepted_tokens
        per_pos = [delta(after, before[name], "specdec:spec_decode_num_accepted_tokens_per_pos_total",
                         position=str(i)) for i in range(len(stats.num_accepted_per_pos) + 1)]
        assert per_pos == [*stats.num_accepted_per_pos, 0]
        assert after[("specdec:num_requests_running", ())] == 0
        assert after[("specdec:kv_cache_reserved_tokens", ())] == 0
    router = scrape(servers["router"])
    assert delta(router, before["router"], "gen_ai_server_time_to_first_token_count") == 1
    assert delta(router, before["router"], "gen_ai_server_time_per_output_token_count") == 1
    assert router[("specdec:num_requests_waiting", ())] == 0
    target = scrape(servers["target"])
    assert delta(target, before["target"], "specdec:verify_batch_size_count") == stats.num_target_forwards
    assert ("specdec:draft_num_sent_total", ()) in scrape(stack.drafts[0].metrics_address)


def test_trace_report_breaks_steps_down(traced, tmp_path, capsys):
    out = generate(traced.stack, 19, "A short story about a robot")
    request_trace(lambda: read_spans(traced.spans_file), 19, out.stats.num_target_forwards)
    plot = tmp_path / "steps.png"
    assert cli_main(["trace-report", str(traced.spans_file), "--labels", "1 user", "--out", str(plot), "--json"]) == 0
    [row] = json.loads(capsys.readouterr().out)
    assert row["label"] == "1 user" and row["num_requests"] >= 1 and row["num_steps"] >= out.stats.num_target_forwards
    assert row["verify_ms"] > 0 and row["commit_ms"] > 0
    assert row["step_ms"] == pytest.approx(sum(row[f"{n}_ms"] for n in ("queue", "draft", "wire", "verify", "commit")),
                                           abs=0.01)
    assert plot.stat().st_size > 10_000
