"""The attacks measured on the open stack, replayed by another peer while a victim generates: each is
refused, and the victim's output is identical to an undisturbed run.

- Release of the victim's sequence at the target or at the draft worker (it ended the victim's stream).
- A Verify stream naming the victim's sequence (it received a stale refusal carrying the victim's whole
  context and every later commit).
- Drafts with a forged q (1e-30) for a sampled victim (each was accepted: injected tokens).
"""
from __future__ import annotations

import queue
import threading
import time

import grpc
import pytest

from e2e.harness import running, running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.rpc.v1 import common_pb2, draft_pb2_grpc, target_pb2, target_pb2_grpc
from specdec.serving_config import RouterConfig

pytestmark = pytest.mark.e2e
PROMPT = [11, 22, 33, 44, 11, 22, 33]
GREEDY = SamplingParams(max_new_tokens=300, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, seed=7, max_new_tokens=300, ignore_eos=True)


@pytest.fixture(scope="module")
def stacks(tiny_models):
    """A router with the draft worker and, on the same target, a second router without one (its sampled
    sequences decode plainly, so a seeded run repeats exactly)."""
    with running_stack(stack_config(tiny_models, "ngram")) as stack:
        plain = RouterConfig(targets=(stack.targets[0].address,), http_port=-1)
        with running("router", plain) as plain_router:
            yield stack, plain_router.address


def victim_ids(target: str, timeout_s: float = 30.0) -> list[str]:
    """The sequence ids the target holds, once it holds one (what a peer reads from GetWorkerInfo)."""
    deadline = time.monotonic() + timeout_s
    with grpc.insecure_channel(target) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        while time.monotonic() < deadline:
            ids = list(stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=5).sequence_ids)
            if ids:
                return ids
            time.sleep(0.005)
    raise AssertionError("the victim's sequence never appeared")


def run_victim(address: str, params: SamplingParams, attack=None) -> list[int]:
    """The victim's tokens; `attack()` runs on a thread while it generates and returns what it saw."""
    seen: list = []
    thread = None
    if attack is not None:
        thread = threading.Thread(target=lambda: seen.append(attack()), daemon=True)
        thread.start()
    with Client(address) as client:
        tokens = client.generate(PROMPT, params, timeout_s=120).token_ids
    if thread is not None:
        thread.join(60)
        assert not thread.is_alive() and seen, "the attack did not finish"
    return tokens if attack is None else (tokens, seen[0])


def release_at_target(target: str):
    def attack():
        seq_id = victim_ids(target)[0]
        with grpc.insecure_channel(target) as channel:
            try:
                target_pb2_grpc.TargetWorkerStub(channel).Release(common_pb2.ReleaseRequest(sequence_id=seq_id),
                                                                  timeout=5)
            except grpc.RpcError as exc:
                return exc.code()
        return None
    return attack


def release_at_draft(target: str, draft: str):
    def attack():
        seq_id = victim_ids(target)[0]
        with grpc.insecure_channel(draft) as channel:
            try:
                draft_pb2_grpc.DraftWorkerStub(channel).Release(common_pb2.ReleaseRequest(sequence_id=seq_id),
                                                                timeout=5)
            except grpc.RpcError as exc:
                return exc.code()
        return None
    return attack


def forged_drafts(target: str, duration_s: float = 3.0, token_id: int = 42):
    """A Verify stream naming the victim's sequence: asks for its state with a stale draft, then sends
    chains of `token_id` claiming q = 1e-30 at every version it learns. Returns every message received."""
    def attack():
        seq_id = victim_ids(target)[0]
        outbox: queue.Queue = queue.Queue()
        received: list = []
        with grpc.insecure_channel(target) as channel:
            call = target_pb2_grpc.TargetWorkerStub(channel).Verify(iter(outbox.get, None), timeout=duration_s + 10)

            def forge(version: int) -> None:
                tree = target_pb2.DraftTree(token_ids=[token_id] * 4, parent_ids=[-1, 0, 1, 2])
                for _ in range(4):
                    tree.q.add(token_ids=[token_id, token_id + 1], probs=[1e-30, 1.0])
                outbox.put(target_pb2.DraftMessage(sequence_id=seq_id, version=version, tree=tree))

            def read() -> None:
                try:
                    for message in call:
                        received.append(message)
                        if message.HasField("commit"):
                            forge(message.commit.version)
                        elif message.refusal.kind == target_pb2.Refusal.STALE:
                            forge(message.refusal.current_version)
                except grpc.RpcError:
                    pass

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                outbox.put(target_pb2.DraftMessage(sequence_id=seq_id, version=0))  # stale: "tell me the state"
                time.sleep(0.05)
            outbox.put(None)
            call.cancel()
            reader.join(5)
        return seq_id, received
    return attack


def test_release_of_another_clients_sequence_is_refused(stacks):
    stack, _ = stacks
    undisturbed = run_victim(stack.address, GREEDY)
    target, draft = stack.targets[0].address, stack.drafts[0].address
    for attack in (release_at_target(target), release_at_draft(target, draft)):
        tokens, code = run_victim(stack.address, GREEDY, attack)
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert tokens == undisturbed


@pytest.mark.parametrize("which", ["greedy, with its draft worker", "sampled, decoding plainly"])
def test_a_foreign_verify_stream_learns_nothing_and_injects_nothing(stacks, which):
    stack, plain_router = stacks
    address, params = (stack.address, GREEDY) if which.startswith("greedy") else (plain_router, SAMPLED)
    undisturbed = run_victim(address, params)
    tokens, (seq_id, received) = run_victim(address, params, forged_drafts(stack.targets[0].address))
    assert received, "the target answered nothing"
    assert not [m for m in received if m.HasField("commit")], "the victim's commits reached a foreign stream"
    assert not [m for m in received if m.refusal.context_ids], "a refusal disclosed the victim's context"
    assert all(m.sequence_id == seq_id for m in received)
    kinds = {m.refusal.kind for m in received}
    assert target_pb2.Refusal.NOT_ATTACHED in kinds and kinds <= {target_pb2.Refusal.NOT_ATTACHED,
                                                                   target_pb2.Refusal.UNKNOWN_SEQUENCE}
    assert all(m.refusal.current_version == 0 for m in received)  # not even the version is disclosed
    assert tokens == undisturbed
