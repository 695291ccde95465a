"""Faults: a draft worker killed mid-request, stale drafts, malformed drafts."""
from __future__ import annotations

import queue

import grpc
import pytest

from e2e.harness import running, running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.rpc.convert import params_to_pb
from specdec.rpc.v1 import common_pb2, target_pb2, target_pb2_grpc
from specdec.serving_config import StackConfig, TargetConfig

pytestmark = pytest.mark.e2e
Refusal = target_pb2.Refusal


def test_killing_the_draft_worker_mid_request(tiny_models, reference):
    params = SamplingParams(max_new_tokens=300, ignore_eos=True)
    prompt = [11, 22, 33, 44, 11, 22]
    expected = reference("draft", prompt, params).token_ids
    with running_stack(stack_config(tiny_models, "draft")) as stack, Client(stack.address) as client:
        token_ids, killed = [], False
        for chunk in client.stream(prompt, params, timeout_s=120):
            token_ids += chunk.token_ids
            if not killed and len(token_ids) >= 20:
                stack.drafts[0].kill()
                killed = True
        assert killed and 20 <= len(token_ids) - len(chunk.token_ids) < 300  # it was killed mid-request
        assert token_ids == expected
        assert chunk.output.token_ids == expected
        # and the router serves on without the dead draft worker
        assert client.generate(prompt[:3], SamplingParams(max_new_tokens=16, ignore_eos=True), timeout_s=60
                               ).token_ids == reference("draft", prompt[:3], SamplingParams(max_new_tokens=16,
                                                                                           ignore_eos=True)).token_ids


class FakeDrafter:
    """Plays a draft worker's side of the Verify stream by hand."""

    def __init__(self, channel):
        self.outbox: queue.Queue = queue.Queue()
        self.call = target_pb2_grpc.TargetWorkerStub(channel).Verify(iter(self.outbox.get, None), timeout=60)

    def send(self, seq_id, version, token_ids=(), parent_ids=None, q=None) -> target_pb2.VerifyMessage:
        tree = target_pb2.DraftTree(token_ids=list(token_ids),
                                    parent_ids=list(range(-1, len(token_ids) - 1)) if parent_ids is None else parent_ids)
        for row in q or ():
            tree.q.add(token_ids=row[0], probs=row[1])
        self.outbox.put(target_pb2.DraftMessage(sequence_id=seq_id, version=version, tree=tree))
        return next(self.call)

    def close(self):
        self.outbox.put(None)
        self.call.cancel()


def test_stale_and_malformed_drafts_are_refused(tiny_models, reference):
    params = SamplingParams(max_new_tokens=24, ignore_eos=True)
    prompt = [5, 6, 7, 8]
    expected = reference("none", prompt, params).token_ids
    config = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, draft_wait_s=60.0,
                          max_tree_nodes=8, load_aware=False)  # the protocol, not the depth policy: verify all
    with running("target", config) as target, grpc.insecure_channel(target.address) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        commits = stub.Admit(target_pb2.AdmitRequest(sequence_id="s1", prompt_ids=prompt, params=params_to_pb(params),
                                                     expect_drafts=True), timeout=60)
        assert next(commits).version == 0
        drafter = FakeDrafter(channel)
        try:
            first = drafter.send("s1", 0, expected[:3])  # a correct draft: all three accepted, plus one
            assert first.commit.version == 1 and list(first.commit.token_ids) == expected[:4]
            assert first.commit.num_accepted == 3

            stale = drafter.send("s1", 0, expected[4:6]).refusal
            assert stale.kind == Refusal.STALE and stale.current_version == 1
            assert list(stale.context_ids) == prompt + expected[:4]

            cases = [
                (dict(version=7, token_ids=[1]), "from the future"),
                (dict(version=1, token_ids=[1, 2], parent_ids=[-1, 3]), "parent index 3"),
                (dict(version=1, token_ids=list(range(9))), "more than the limit 8"),
                (dict(version=1, token_ids=[10 ** 6]), "outside the vocabulary"),
                (dict(version=1, token_ids=[1, 2], parent_ids=[-1]), "parent ids"),
                (dict(version=1, token_ids=[3], q=[([3, 4], [0.5, 0.2])]), "sums to"),
                (dict(version=1, token_ids=[3], q=[([4], [1.0])]), "probability 0"),
            ]
            for kwargs, reason in cases:
                refusal = drafter.send("s1", **kwargs).refusal
                assert refusal.kind == Refusal.MALFORMED and reason in refusal.reason, (kwargs, refusal.reason)
                assert refusal.current_version == 1  # never verified: the sequence did not move
            unknown = drafter.send("nope", 0, [1]).refusal
            assert unknown.kind == Refusal.UNKNOWN_SEQUENCE

            version, generated = 1, list(expected[:4])
            while True:  # finish with plain steps (empty drafts) and check nothing was corrupted
                commit = drafter.send("s1", version).commit
                assert commit.version == version + 1
                version, generated = commit.version, generated + list(commit.token_ids)
                if commit.finish_reason:
                    break
            assert generated == expected
            streamed = [t for c in commits for t in c.token_ids]
            assert streamed == expected
            assert list(stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10).sequence_ids) == []
        finally:
            drafter.close()


def test_self_drafting_target_needs_no_draft_worker(tiny_models, reference):
    """A target that drafts for itself (here a draft model; Medusa / EAGLE heads run the same way)."""
    target = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, drafter="draft",
                          draft=str(tiny_models["draft"]))
    config = StackConfig(targets=(target,), drafts=(), ready_timeout_s=120)
    prompt, params = [5, 17, 99, 3, 5, 17, 99, 3, 5, 17], SamplingParams(max_new_tokens=40, ignore_eos=True)
    with running_stack(config) as stack, Client(stack.address) as client:
        out = client.generate(prompt, params, timeout_s=60)
        info = client.server_info()
    assert info.targets[0].info.drafter == "draft" and not info.drafts
    assert out.token_ids == reference("draft", prompt, params).token_ids
    assert out.stats.num_draft_tokens > 0
