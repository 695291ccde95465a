"""Bounded inputs, end to end on 127.0.0.1: oversized prompts are refused by their size before they
are tokenized (both doors, at once, without the router's memory growing), long prompts within the
bound are tokenized without stalling anyone, and every other request limit is refused naming it."""
from __future__ import annotations

import json
import math
import threading
import time

import grpc
import httpx
import pytest

from e2e.harness import running_stack, stack_config
from router.limits import derive_limits
from router.prompts import PromptEncoder
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.rpc.server import channel_options
from specdec.rpc.v1 import generation_pb2, generation_pb2_grpc

pytestmark = pytest.mark.e2e
SMALL = SamplingParams(max_new_tokens=8, ignore_eos=True)
HUGE_BYTES = 16 << 20


@pytest.fixture(scope="module")
def stack(tiny_models):
    with running_stack(stack_config(tiny_models, "ngram")) as stack:
        yield stack


@pytest.fixture(scope="module")
def limits(tiny_models):
    return derive_limits(1024, PromptEncoder(tiny_models["target"], 49152).longest_token_bytes())


def peak_rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        line = next(line for line in status if line.startswith("VmHWM:"))
    return int(line.split()[1]) * 1024


class SmallRequests:
    """Small generations one after another on a thread; the longest one's seconds, once stopped."""

    def __init__(self, address: str):
        self.address, self.durations, self.errors = address, [], []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with Client(self.address) as client:
            while not self.done.is_set():
                start = time.monotonic()
                try:
                    client.generate([5, 6, 7], SMALL, timeout_s=60)
                except Exception as exc:  # noqa: BLE001 - reported by the test
                    self.errors.append(exc)
                self.durations.append(time.monotonic() - start)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=60)


def time_small(address: str, rounds: int = 3) -> float:
    with Client(address) as client:
        client.generate([5, 6, 7], SMALL, timeout_s=60)  # warm
        start = time.monotonic()
        for _ in range(rounds):
            client.generate([5, 6, 7], SMALL, timeout_s=60)
    return (time.monotonic() - start) / rounds


def test_a_16mb_prompt_is_refused_at_once(stack, limits):
    baseline_s = time_small(stack.address)
    rss_before = peak_rss_bytes(stack.router.popen.pid)
    huge = "the cat sat on the mat. " * (HUGE_BYTES // 24)
    message = generation_pb2.GenerateRequest(text=huge).SerializeToString()  # built before the clock starts
    body = json.dumps({"prompt": huge}).encode()
    with SmallRequests(stack.address) as small, \
            grpc.insecure_channel(stack.address, options=channel_options()) as channel:
        time.sleep(0.3)
        generate = channel.unary_stream("/specdec.v1.Generation/Generate")  # sends the bytes as they are
        grpc_s, http_s = [], []  # three tries each: the best is what the router costs, not this busy machine
        for _ in range(3):
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                list(generate(message, timeout=10))
            grpc_s.append(time.monotonic() - start)
            start = time.monotonic()
            response = httpx.post(f"http://{stack.http_address}/v1/completions", content=body, timeout=10,
                                  headers={"content-type": "application/json"})
            http_s.append(time.monotonic() - start)
        time.sleep(0.5)
    # read (gRPC's limit is well above the largest valid request) and refused by its size, naming the limit
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"the limit is {limits.max_prompt_bytes} (max_prompt_bytes)" in refused.value.details()
    assert response.status_code == 413 and "the limit is" in response.json()["error"]["message"]
    assert min(grpc_s) < 0.25 and min(http_s) < 0.25, (grpc_s, http_s)
    assert peak_rss_bytes(stack.router.popen.pid) - rss_before < 100 << 20
    assert not small.errors and small.durations
    assert max(small.durations) < 3 * baseline_s + 1.0, (baseline_s, small.durations)


def test_a_message_over_the_grpc_limit_is_refused_unread(stack, limits):
    """Above max_receive_bytes (32 MiB here) gRPC itself refuses the message, naming its own limit."""
    message = generation_pb2.GenerateRequest(text="x" * (limits.max_receive_bytes + 1)).SerializeToString()
    with grpc.insecure_channel(stack.address, options=channel_options()) as channel, \
            pytest.raises(grpc.RpcError) as refused:
        list(channel.unary_stream("/specdec.v1.Generation/Generate")(message, timeout=20))
    assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert f"vs. {limits.max_receive_bytes}" in refused.value.details()


def test_a_prompt_over_max_prompt_bytes_is_refused_before_tokenizing(stack, limits):
    over = "a" * (limits.max_prompt_bytes + 1)
    with grpc.insecure_channel(stack.address, options=channel_options()) as channel:
        grpc.channel_ready_future(channel).result(timeout=20)  # the refusal is timed, not the connection
        took_s = []  # best of three: what the refusal costs, not this busy machine's scheduling
        for _ in range(3):
            start = time.monotonic()
            with pytest.raises(grpc.RpcError) as refused:
                list(generation_pb2_grpc.GenerationStub(channel).Generate(generation_pb2.GenerateRequest(text=over),
                                                                           timeout=20))
            took_s.append(time.monotonic() - start)
        assert min(took_s) < 0.25, took_s
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert f"the limit is {limits.max_prompt_bytes} (max_prompt_bytes)" in refused.value.details()
    for path, body in (("completions", {"prompt": over}),
                       ("chat/completions", {"messages": [{"role": "user", "content": over}]})):
        response = httpx.post(f"http://{stack.http_address}/v1/{path}", json=body, timeout=20)
        error = response.json()["error"]
        assert response.status_code == 400 and "max_prompt_bytes" in error["message"], error
        assert error["param"] == ("prompt" if path == "completions" else "messages")


def test_long_prompts_within_the_bound_stall_nobody(stack, limits):
    """Four prompts just under max_prompt_bytes at once: tokenized off the request threads (the GIL is
    let go), then refused for the context; small requests meanwhile run at their usual pace."""
    baseline_s = time_small(stack.address)
    words = " ".join(f"w{i}x{i * 7 % 13}" for i in range(limits.max_prompt_bytes))
    text = words[:limits.max_prompt_bytes]
    results = []

    def send() -> None:
        with Client(stack.address) as client:
            try:
                client.generate(text, SMALL, timeout_s=60)
                results.append("generated")
            except Exception as exc:  # noqa: BLE001
                results.append(str(exc))

    with SmallRequests(stack.address) as small:
        time.sleep(0.3)
        senders = [threading.Thread(target=send) for _ in range(4)]
        for thread in senders:
            thread.start()
        for thread in senders:
            thread.join(timeout=60)
        time.sleep(0.3)
    assert len(results) == 4 and all("exceeds the model's context of 1024 tokens" in r for r in results), results
    assert not small.errors and max(small.durations) < 3 * baseline_s + 1.0, (baseline_s, small.durations)


@pytest.mark.parametrize("kwargs, words", [
    (dict(prompt=[{"role": "wizard", "content": "hi"}], chat=True), "is not one of system"),
    (dict(prompt="hi", params=SamplingParams(stop=tuple(f"s{i}" for i in range(17)))), "(max_stop_strings)"),
    (dict(prompt="hi", params=SamplingParams(stop=("x" * 257,))), "(max_stop_bytes)"),
    (dict(prompt=[{"role": "user", "content": "hi"}] * 513, chat=True), "(max_messages)"),
])
def test_request_limits_are_refused_naming_them(stack, kwargs, words):
    from specdec.errors import InvalidArgument

    with Client(stack.address) as client, pytest.raises(InvalidArgument) as refused:
        client.generate(kwargs.pop("prompt"), kwargs.pop("params", SMALL), timeout_s=20, **kwargs)
    assert words in str(refused.value)


@pytest.mark.parametrize("temperature", [math.inf, 1e300])
def test_temperature_outside_its_range_is_refused(stack, temperature):
    with grpc.insecure_channel(stack.address) as channel:
        request = generation_pb2.GenerateRequest(text="hi")
        request.params.temperature = temperature
        with pytest.raises(grpc.RpcError) as refused:
            list(generation_pb2_grpc.GenerationStub(channel).Generate(request, timeout=20))
    assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT and "temperature" in refused.value.details()
    body = json.dumps({"prompt": "hi", "temperature": temperature})  # inf as Infinity, which Python's JSON reads
    response = httpx.post(f"http://{stack.http_address}/v1/completions", content=body, timeout=20,
                          headers={"content-type": "application/json"})
    assert response.status_code == 400 and response.json()["error"]["param"] == "temperature"
