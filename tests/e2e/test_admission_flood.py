"""A busy trusted caller admitting sequences straight at a target (bypassing the router) cannot starve
the router's calls: the target's threads cover every sequence it admits plus its draft links plus a
reserve, so a routed request still gets its call, its slot and its exact output; admissions beyond
the target's limit are refused at once with RESOURCE_EXHAUSTED."""
from __future__ import annotations

import threading
import time

import grpc
import pytest

from e2e.harness import running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.rpc.convert import params_to_pb
from specdec.rpc.v1 import target_pb2, target_pb2_grpc

pytestmark = pytest.mark.e2e
MAX_SEQUENCES = 64  # the target's default
FLOOD = SamplingParams(max_new_tokens=1000, ignore_eos=True)
ROUTED = SamplingParams(max_new_tokens=16, ignore_eos=True)


def hold(stub, seq_id: str, admitted: threading.Event, calls: list) -> None:
    """One flooding sequence: admitted, then its commits read and dropped until cancelled."""
    call = stub.Admit(target_pb2.AdmitRequest(sequence_id=seq_id, prompt_ids=[7, 8, 9], params=params_to_pb(FLOOD)),
                      timeout=120)
    calls.append(call)
    try:
        for i, _ in enumerate(call):
            if i == 0:
                admitted.set()
    except grpc.RpcError:
        pass


def test_admission_flood_leaves_routed_requests_alone(tiny_models, reference):
    expected = reference("ngram", [5, 6, 7, 8], ROUTED).token_ids
    with running_stack(stack_config(tiny_models, "ngram")) as stack, \
            grpc.insecure_channel(stack.targets[0].address) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        calls: list = []
        held = [threading.Event() for _ in range(MAX_SEQUENCES - 1)]  # all slots but one, each a stream
        threads = [threading.Thread(target=hold, args=(stub, f"flood-{i}", event, calls), daemon=True)
                   for i, event in enumerate(held)]
        try:
            for thread in threads:
                thread.start()
            assert all(event.wait(60) for event in held)
            with Client(stack.address) as client:
                stream = client.stream([5, 6, 7, 8], ROUTED, timeout_s=60)
                first = next(stream)  # admitted into the last slot, through a thread of its own
                refusals = []
                for i in range(20):  # the target is full now: more admissions are refused at once
                    start = time.monotonic()
                    with pytest.raises(grpc.RpcError) as refused:
                        next(stub.Admit(target_pb2.AdmitRequest(sequence_id=f"over-{i}", prompt_ids=[7],
                                                                params=params_to_pb(FLOOD)), timeout=30))
                    refusals.append((refused.value.code(), time.monotonic() - start))
                chunks = [first, *stream]
        finally:
            for call in calls:
                call.cancel()
            for thread in threads:
                thread.join(timeout=10)
    assert [t for c in chunks for t in c.token_ids] == expected
    assert all(code == grpc.StatusCode.RESOURCE_EXHAUSTED for code, _ in refusals), refusals
    assert max(seconds for _, seconds in refusals) < 1.0, refusals
