"""A decode loop that cannot die silently: faults injected into the target worker's steps through its
test hook (`TargetWorker(fault=...)`), with real gRPC streams on 127.0.0.1.

- A verify step that fails for one sequence (after the forward and the verdicts, just before the
  commit) fails that sequence alone, with INTERNAL naming the cause; the sequence batched with it
  decodes on, its output identical to an undisturbed run: the failed batch's caches are rolled back
  before each sequence retries alone, so nothing is stepped twice.
- A decode loop that cannot go on turns health NOT_SERVING, ends every stream with UNAVAILABLE at
  once, refuses new sequences, and a router in front of it answers UNAVAILABLE instead of waiting.
"""
from __future__ import annotations

import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from e2e.harness import running
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.engine import Engine
from specdec.errors import Unavailable
from specdec.rpc.convert import params_to_pb
from specdec.rpc.server import start_server
from specdec.rpc.v1 import target_pb2, target_pb2_grpc
from specdec.serving_config import RouterConfig, TargetConfig
from target_service.server import TargetServicer
from target_service.worker import TargetWorker

pytestmark = pytest.mark.e2e
PARAMS = SamplingParams(max_new_tokens=24, ignore_eos=True)
PROMPTS = {"good": [11, 12, 13, 14], "bad": [21, 22, 23]}


class InjectedFault(RuntimeError):
    pass


class Faults:
    """The hook: raise at `point` once `after` calls have passed, for steps holding `victim` (any if None).

    batch_of: the first fault waits for a step of that many sequences, and until then each smaller step
    is slowed by SOLO_DELAY_S, so the others' admissions (handled between steps) catch up. On a loaded
    CI machine one stream's Admit can reach the worker several steps after the other's, and the fault
    then hit the victim alone, which is not the case under test."""

    SOLO_DELAY_S = 0.05

    def __init__(self, point: str, after: int, victim: str | None = None, batch_of: int = 0):
        self.point, self.after, self.victim, self.batch_of, self.calls = point, after, victim, batch_of, 0
        self.fired = False
        self.seen: list[list[str]] = []

    def __call__(self, point: str, seq_ids: list[str]) -> None:
        if point != self.point:
            return
        self.seen.append(list(seq_ids))
        self.calls += 1
        if not self.fired and len(seq_ids) < self.batch_of:
            time.sleep(self.SOLO_DELAY_S)
            return
        if self.calls > self.after and (self.victim is None or self.victim in seq_ids):
            self.fired = True
            raise InjectedFault(f"injected fault at {point}")


@pytest.fixture
def target(tiny_models):
    """start(fault) -> (worker, address): a target worker with the hook, behind a real gRPC server."""
    started = []

    def start(fault):
        engine = Engine.from_pretrained(str(tiny_models["target"]), dtype="float32")
        worker = TargetWorker(engine, TargetConfig(batch_wait_s=0.5, max_batch=4), fault=fault)
        server = start_server(lambda s: target_pb2_grpc.add_TargetWorkerServicer_to_server(TargetServicer(worker), s),
                              ["specdec.v1.TargetWorker"])
        worker.on_broken = lambda: server.set_serving(False)
        started.append((worker, server))
        return worker, server.address

    yield start
    for worker, server in started:
        server.stop()
        worker.stop()


def admit(stub, seq_id: str):
    """The Admit stream; its first message (version 0) says the prompt is prefilled."""
    return stub.Admit(target_pb2.AdmitRequest(sequence_id=seq_id, prompt_ids=PROMPTS[seq_id],
                                              params=params_to_pb(PARAMS)), timeout=60)


def collect(call, into: dict, key: str) -> None:
    tokens = []
    try:
        for commit in call:
            tokens += commit.token_ids
        into[key] = tokens
    except grpc.RpcError as exc:
        into[key] = (exc.code(), exc.details(), time.monotonic())


def run_both(stub) -> dict:
    """Both sequences decoded together (one batch); each one's tokens, or (code, details, when it ended)."""
    results: dict = {}
    calls = {key: admit(stub, key) for key in PROMPTS}
    threads = [threading.Thread(target=collect, args=(calls[k], results, k)) for k in PROMPTS]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results


def test_a_failing_step_fails_only_its_sequence(target, reference):
    faults = Faults("verify", after=6, victim="bad", batch_of=2)
    worker, address = target(faults)
    with grpc.insecure_channel(address) as channel:
        results = run_both(target_pb2_grpc.TargetWorkerStub(channel))
    code, details, _ = results["bad"]
    assert code == grpc.StatusCode.INTERNAL and "injected fault at verify" in details and "bad" in details
    assert results["good"] == reference("none", PROMPTS["good"], PARAMS).token_ids  # decoded on, not stepped twice
    assert ["bad", "good"] in [sorted(s) for s in faults.seen]  # the failing step was a batch of both
    assert ["good"] in faults.seen and ["bad"] in faults.seen  # ... retried one by one after the rollback
    assert worker.broken is None and worker.info()[0] == []


def test_an_admission_the_dead_loop_overtook_is_refused(target):
    """The loop can die while an admission opens its sequence outside the worker's lock: _break has
    then ended every stream it held, so the admission must be refused (UNAVAILABLE), not joined to a
    worker that will never step it (its stream waited out its deadline)."""
    from specdec.errors import Unavailable

    worker, _ = target(None)
    admit_on_ranks = worker.mirror.admit

    def overtaken(*args):
        opened = admit_on_ranks(*args)
        worker._break("decode loop stopped: overtaken")  # what the loop thread does when a step raises
        return opened

    worker.mirror.admit = overtaken
    with pytest.raises(Unavailable, match="decode loop stopped: overtaken"):
        worker.admit("late", PROMPTS["good"], PARAMS, expect_drafts=False)
    assert worker.info()[0] == []


def test_a_dead_loop_says_so_and_ends_every_stream(target, tiny_models):
    faults = Faults("loop", after=3)
    worker, address = target(faults)
    with grpc.insecure_channel(address) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        started = time.monotonic()
        results = run_both(stub)
        for key in PROMPTS:  # every stream ended with UNAVAILABLE, at once (their deadline is 60 s away)
            code, details, ended = results[key]
            assert code == grpc.StatusCode.UNAVAILABLE and "decode loop stopped" in details
            assert ended - started < 15.0
        health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
        assert health.status == health_pb2.HealthCheckResponse.NOT_SERVING
        with pytest.raises(grpc.RpcError) as refused:
            next(admit(stub, "good"))
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
    with running("router", RouterConfig(targets=(address,), tokenizer=str(tiny_models["target"]))) as router, \
            Client(router.address) as client:
        start = time.monotonic()
        with pytest.raises(Unavailable):
            client.generate(PROMPTS["good"], PARAMS, timeout_s=30)
        assert time.monotonic() - start < 5.0  # refused, not left waiting for a dead target


class SlowSteps:
    """The hook: each verify sleeps `delay_s` (inside the model lock, as a long forward would); counts them."""

    def __init__(self, delay_s: float):
        self.delay_s, self.calls = delay_s, 0

    def __call__(self, point: str, seq_ids: list[str]) -> None:
        if point == "verify":
            self.calls += 1
            time.sleep(self.delay_s)


def test_an_admission_is_not_starved_by_a_busy_decode_loop(target):
    """The loop takes the model lock again right after each step; an admission waiting for it (to open
    its sequence) must get it at the next turn, not after every running sequence has finished."""
    slow = SlowSteps(delay_s=0.05)
    worker, _ = target(slow)
    long = SamplingParams(max_new_tokens=200, ignore_eos=True)
    worker.admit("busy", PROMPTS["bad"], long, expect_drafts=False)
    deadline = time.monotonic() + 30
    while slow.calls < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert slow.calls >= 3, "the first sequence never started decoding"
    steps_before = slow.calls
    worker.admit("late", PROMPTS["good"], long, expect_drafts=False)
    assert slow.calls - steps_before <= 3  # admitted at the next turn or so (200 steps if starved)
    assert sorted(worker.info()[0]) == ["busy", "late"]
    worker.release("busy")
    worker.release("late")
