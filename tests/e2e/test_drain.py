"""Graceful drain: SIGTERM on a target with running generations lets each finish (its exact greedy
output), places no new one there, and the target exits within its grace period; SIGTERM on the router
finishes what it runs, refuses what comes after, and exits."""
from __future__ import annotations

import dataclasses
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.harness import ENV, READY_TIMEOUT_S
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.errors import Unavailable
from specdec.launch import spawn, wait_ready
from specdec.rpc.v1 import common_pb2, target_pb2_grpc
from specdec.serving_config import RouterConfig, TargetConfig

pytestmark = pytest.mark.e2e
LONG = SamplingParams(max_new_tokens=400, ignore_eos=True)
SHORT = SamplingParams(max_new_tokens=16, ignore_eos=True)
PROMPTS = ([11, 22, 33, 44], [5, 6, 7, 8, 9])
GRACE_S = 60.0


@pytest.fixture(scope="module")
def servers(tiny_models):
    """Target A (a large KV cache: the router places on it first), target B (a small one), a router."""
    base = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, drain_timeout_s=GRACE_S)
    configs = {"a": base, "b": dataclasses.replace(base, max_kv_tokens=4096)}
    processes = {name: spawn("target", config, env=ENV) for name, config in configs.items()}
    try:
        for process in processes.values():
            wait_ready(process, READY_TIMEOUT_S)
        router = spawn("router", RouterConfig(targets=(processes["a"].address, processes["b"].address),
                                              http_port=-1, drain_timeout_s=GRACE_S), env=ENV)
        processes["router"] = router
        wait_ready(router, READY_TIMEOUT_S)
        yield processes
    finally:
        for process in processes.values():
            process.stop()


def worker_info(address: str) -> common_pb2.WorkerInfo:
    with grpc.insecure_channel(address) as channel:
        return target_pb2_grpc.TargetWorkerStub(channel).GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)


def wait_not_serving(address: str, timeout_s: float) -> None:
    """Until the server's health says NOT_SERVING (it began to drain), polled every 5 ms."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(address) as channel:
        health = health_pb2_grpc.HealthStub(channel)
        while time.monotonic() < deadline:
            try:
                status = health.Check(health_pb2.HealthCheckRequest(service=""), timeout=1).status
            except grpc.RpcError:
                return  # already gone
            if status == health_pb2.HealthCheckResponse.NOT_SERVING:
                return
            time.sleep(0.005)
    raise AssertionError(f"{address} did not start draining within {timeout_s} s")


class Streams:
    """Generations on threads: each records its token ids and when each chunk arrived."""

    def __init__(self, address: str, prompts, params: SamplingParams):
        self.results: dict = {}
        self.started = [threading.Event() for _ in prompts]
        self.threads = [threading.Thread(target=self._run, args=(address, i, p, params), daemon=True)
                        for i, p in enumerate(prompts)]
        for thread in self.threads:
            thread.start()

    def _run(self, address, index, prompt, params) -> None:
        tokens, times, finish = [], [], None
        try:
            with Client(address) as client:
                for chunk in client.stream(prompt, params, timeout_s=120):
                    tokens += chunk.token_ids
                    times.append(time.monotonic())
                    self.started[index].set()
                    finish = chunk.output.finish_reason if chunk.output else finish
        except Exception as exc:  # noqa: BLE001 - reported by the test
            finish = exc
        self.results[index] = (tokens, times, finish)
        self.started[index].set()

    def join(self, timeout_s: float = 120.0) -> dict:
        for thread in self.threads:
            thread.join(timeout_s)
        return self.results


def test_sigterm_on_a_target_finishes_its_generations_and_places_nothing_new_there(servers, reference):
    a, b, router = servers["a"], servers["b"], servers["router"]
    long = Streams(router.address, PROMPTS, LONG)
    assert all(event.wait(60) for event in long.started)
    running = set(worker_info(a.address).sequence_ids)
    assert len(running) == len(PROMPTS) and not worker_info(b.address).sequence_ids  # all three on A
    served_before = worker_info(b.address).num_served
    signalled = time.monotonic()
    a.popen.terminate()
    # A request that reaches A before A has handled its SIGTERM is A's to finish (make test once placed both
    # there so): wait for A to drain, but no longer, so the router may not have heard A yet.
    wait_not_serving(a.address, timeout_s=10.0)
    short = Streams(router.address, PROMPTS, SHORT)
    short_results = short.join()
    try:
        assert set(worker_info(a.address).sequence_ids) <= running  # A admitted nothing new while draining
    except grpc.RpcError:
        pass  # A already finished its sequences and exited
    assert worker_info(b.address).num_served - served_before == len(PROMPTS)  # every new one ran on B
    for i, prompt in enumerate(PROMPTS):
        assert short_results[i][0] == reference("none", prompt, SHORT).token_ids
    results = long.join()
    a.popen.wait(GRACE_S)
    exited = time.monotonic() - signalled
    assert a.popen.returncode == 0 and exited < GRACE_S
    for i, prompt in enumerate(PROMPTS):
        tokens, times, finish = results[i]
        assert finish == "length" and tokens == reference("none", prompt, LONG).token_ids
        assert sum(t > signalled for t in times) > 1  # it was still running when the signal came
    lines = "".join(a.lines)
    assert f"draining: {len(PROMPTS)} running" in lines and "drained in" in lines


def test_sigterm_on_the_router_finishes_what_it_runs_and_refuses_the_rest(servers, reference):
    router = servers["router"]
    long = Streams(router.address, PROMPTS[:1], LONG)
    assert long.started[0].wait(60)
    signalled = time.monotonic()
    router.popen.terminate()
    time.sleep(0.2)  # the signal is handled
    with Client(router.address) as client, pytest.raises(Unavailable):
        client.generate(PROMPTS[1], SHORT, timeout_s=30)
    tokens, times, finish = long.join()[0]
    assert finish == "length" and tokens == reference("none", PROMPTS[0], LONG).token_ids
    assert sum(t > signalled for t in times) > 1
    router.popen.wait(GRACE_S)
    assert router.popen.returncode == 0 and time.monotonic() - signalled < GRACE_S
