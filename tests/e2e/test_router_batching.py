"""Router batching over real processes: KV-capacity admission, fairness between users, info figures.

Two targets decode alone (no draft worker, so greedy output equals the plain in-process decode):
one with a small KV budget (KV_TOKENS) for admission, one with the default budget whose long
generations hold a two-slot router busy for the fairness test.
"""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from e2e.harness import running
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument
from specdec.rpc.convert import params_to_pb
from specdec.rpc.v1 import common_pb2, target_pb2, target_pb2_grpc
from specdec.serving_config import RouterConfig, TargetConfig

pytestmark = pytest.mark.e2e
KV_TOKENS = 640
WAIT_S = 60.0


def _target(tiny_models, **overrides) -> TargetConfig:
    return TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, **overrides)


@pytest.fixture(scope="module")
def kv_stack(tiny_models):
    """(target, router): the target holds KV_TOKENS tokens of KV cache in all."""
    with running("target", _target(tiny_models, max_kv_tokens=KV_TOKENS)) as target, \
            running("router", RouterConfig(targets=(target.address,), max_active=8, max_queue=16)) as router:
        yield target, router


class Reader:
    """One request streamed on its own thread; remembers when its first chunk came and the output."""

    def __init__(self, client: Client, prompt, params: SamplingParams, user: str = ""):
        self.first_at, self.output, self.error = None, None, None
        self.thread = threading.Thread(target=self._run, args=(client, prompt, params, user), daemon=True)
        self.thread.start()

    def _run(self, client, prompt, params, user):
        try:
            for chunk in client.stream(prompt, params, timeout_s=WAIT_S, user=user):
                if self.first_at is None:
                    self.first_at = time.monotonic()
                self.output = chunk.output or self.output
        except Exception as exc:  # noqa: BLE001 - the test inspects it
            self.error = exc

    def join(self):
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "request did not finish"
        if self.error is not None:
            raise self.error
        return self.output


def _until(condition, what: str, timeout_s: float = 30.0) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        time.sleep(0.02)


def _queued(client: Client, user: str) -> int:
    return next((u.num_queued for u in client.server_info().users if u.user == user), 0)


def test_requests_beyond_kv_capacity_wait_and_all_complete(kv_stack, reference):
    """5 requests of 216 tokens each on a 640-token cache: two run at once, the rest wait their turn."""
    _, router = kv_stack
    params = SamplingParams(max_new_tokens=16, ignore_eos=True)
    prompts = [[100 + (7 * i + j) % 500 for j in range(200)] for i in range(5)]
    with Client(router.address) as client:
        readers = [Reader(client, p, params, user=f"user{i}") for i, p in enumerate(prompts)]
        outputs = [r.join() for r in readers]
        info = client.server_info()
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == reference("none", prompt, params).token_ids
    target = info.targets[0].info
    assert target.kv_capacity_tokens == info.kv_capacity_tokens == KV_TOKENS
    assert target.num_refused == 0  # the router never sent more than the target could hold
    assert info.num_admitted >= 5 and info.queue_wait_p99_s >= 0.005  # someone waited for KV room
    assert (info.num_active, info.num_queued, info.kv_reserved_tokens, target.kv_reserved_tokens) == (0, 0, 0, 0)


def test_a_request_larger_than_the_kv_cache_is_invalid(kv_stack):
    _, router = kv_stack
    with Client(router.address) as client, \
            pytest.raises(InvalidArgument, match=rf"needs 703 tokens of KV cache.*largest: {KV_TOKENS} tokens"):
        client.generate([1, 2, 3], SamplingParams(max_new_tokens=700), timeout_s=30)


def test_the_target_itself_refuses_what_its_cache_cannot_hold(kv_stack):
    """Behind the router's back (another router, a direct caller) the target guards its own budget."""
    target, _ = kv_stack
    with grpc.insecure_channel(target.address) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)

        def admit(seq_id, num_new):  # expecting drafts that never come: the first steps wait draft_wait_s
            return stub.Admit(target_pb2.AdmitRequest(sequence_id=seq_id, prompt_ids=[1, 2, 3, 4], params=params_to_pb(
                SamplingParams(max_new_tokens=num_new, ignore_eos=True)), expect_drafts=True), timeout=30)

        with pytest.raises(grpc.RpcError) as err:
            next(admit("too-big", 700))
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert f"needs 704 tokens of KV cache, more than this target's whole cache of {KV_TOKENS}" in err.value.details()
        held = admit("held", 396)  # 400 of 640 reserved
        try:
            next(held)
            with pytest.raises(grpc.RpcError) as err:
                next(admit("second", 300))
            assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "needs 304 tokens" in err.value.details() and "240 of 640 are free" in err.value.details()
            info = stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)
            assert (info.kv_reserved_tokens, info.num_sequences, info.max_sequences) == (400, 1, 64)
            assert 4 <= info.kv_used_tokens <= 400 and info.num_refused >= 1
        finally:
            held.cancel()
        _until(lambda: stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10).kv_reserved_tokens == 0,
               "the cancelled sequence to give its KV back")


def test_a_flooding_user_does_not_starve_another(tiny_models, reference):
    """alice fills both slots and queues two more; bob's one request starts before alice's queued ones."""
    long = SamplingParams(max_new_tokens=900, ignore_eos=True)
    short = SamplingParams(max_new_tokens=8, ignore_eos=True)
    with running("target", _target(tiny_models)) as target, \
            running("router", RouterConfig(targets=(target.address,), max_active=2, max_queue=8)) as router, \
            Client(router.address) as client:
        running_streams = [client.stream([3, 1, 4, i], long, timeout_s=WAIT_S, user="alice") for i in range(2)]
        try:
            for stream in running_streams:
                next(stream)  # both slots taken
            alice = []
            for i in range(2):
                alice.append(Reader(client, [2, 7, 1, i], short, user="alice"))
                _until(lambda: _queued(client, "alice") == i + 1, "alice's request to queue")
            bob = Reader(client, [1, 6, 1, 8], short, user="bob")
            _until(lambda: _queued(client, "bob") == 1, "bob's request to queue")
            info = client.server_info()
            assert (info.num_active, info.num_queued, info.num_users_waiting) == (2, 3, 2)
            assert {(u.user, u.num_active, u.num_queued) for u in info.users} == {("alice", 2, 2), ("bob", 0, 1)}
            running_streams[0].close()  # a slot frees: bob runs nothing, so bob goes first
            _until(lambda: bob.first_at is not None, "bob to start")
        finally:
            for stream in running_streams:
                stream.close()
        outputs = [r.join() for r in alice]
        assert bob.join().token_ids == reference("none", [1, 6, 1, 8], short).token_ids
        assert all(bob.first_at < r.first_at for r in alice)
        assert [o.token_ids for o in outputs] == [reference("none", [2, 7, 1, i], short).token_ids for i in range(2)]


def test_info_figures_are_consistent(kv_stack):
    _, router = kv_stack
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    with Client(router.address) as client:
        before = client.server_info()
        stream = client.stream([5, 6, 7], SamplingParams(max_new_tokens=600, ignore_eos=True), timeout_s=WAIT_S)
        next(stream)
        during = client.server_info()
        stream.close()
        readers = [Reader(client, [9, 8, 7, i], params, user="figures") for i in range(3)]
        for r in readers:
            r.join()
        _until(lambda: client.server_info().num_active == 0, "the cancelled request to end")
        after = client.server_info()
    # while running: one anonymous user (keyed by its connection), its KV reserved at router and target
    assert [(u.num_active, u.num_queued) for u in during.users] == [(1, 0)]
    assert during.users[0].user.startswith(("ipv4:", "ipv6:"))
    assert during.kv_reserved_tokens == during.targets[0].info.kv_reserved_tokens == 603
    assert during.num_active == 1 and during.kv_used_tokens >= 4
    # afterwards: totals moved by what was sent, batch figures are the targets' own
    assert after.num_admitted - before.num_admitted == 4
    assert after.num_rejected == before.num_rejected and not after.users and after.kv_reserved_tokens == 0
    target = after.targets[0].info
    assert after.num_verify_forwards == target.num_verify_forwards > 0
    assert after.num_sequence_steps == target.num_sequence_steps >= after.num_verify_forwards
    assert after.mean_batch_size == pytest.approx(target.num_sequence_steps / target.num_verify_forwards)
    assert 1 <= after.max_batch_seen == target.max_batch_seen <= target.max_batch
    assert 0.0 <= after.queue_wait_p50_s <= after.queue_wait_p99_s


def test_prompts_sharing_an_opening_restore_it_and_decode_unchanged(kv_stack, tiny_models):
    """Three prompts opening with the same 40 tokens: the later two restore its blocks from the target's
    prefix cache (GetWorkerInfo's figures move), and every output equals an uncached in-process engine's."""
    import torch

    from specdec.engine import Engine

    target, router = kv_stack
    opening = [200 + j for j in range(40)]
    prompts = [opening + [7, 8, 9], opening + [11], opening + [12, 13]]
    params = SamplingParams(max_new_tokens=12, ignore_eos=True)
    with grpc.insecure_channel(target.address) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        before = stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)
        with Client(router.address) as client:
            outputs = [client.generate(p, params, timeout_s=WAIT_S) for p in prompts]
        after = stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)
    # whole 8-token blocks, leaving at least one prompt token to prefill: 32 of the second's 40, 40 of the third's 41
    assert after.prefix_cache_hit_tokens - before.prefix_cache_hit_tokens == 32 + 40
    assert after.prefix_cache_looked_up_tokens > before.prefix_cache_looked_up_tokens
    assert after.prefix_cache_bytes > 0
    torch.set_num_threads(1)
    uncached = Engine.from_pretrained(str(tiny_models["target"]), dtype="float32", prefix_cache_mb=0)
    for prompt, out in zip(prompts, outputs):
        assert out.token_ids == uncached.generate(prompt, params).token_ids
