"""Load-aware budgets over gRPC: when a sequence's budget drops to 0 its draft worker is told once
(draft_budget 0) and drafts nothing; the steps' tokens follow in one catch-up commit (base_version)
when the budget comes back, so the worker drafts on the current version at once (no stale refusal, no
resynchronisation), drafts are accepted again, and the output still equals plain decoding token for
token. In process, so the budget can be scripted."""
from __future__ import annotations

import grpc
import torch

from draft_service.worker import DraftWorker
from specdec.core.types import SamplingParams
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner
from specdec.engine import Engine
from specdec.policy import NO_CAP, SpeculationPolicy
from specdec.rpc.convert import params_to_pb
from specdec.rpc.server import start_server
from specdec.rpc.v1 import target_pb2, target_pb2_grpc
from specdec.serving_config import DraftConfig, TargetConfig
from target_service.server import TargetServicer
from target_service.worker import TargetWorker


class RecordingDraftWorker(DraftWorker):
    """Notes the commits the target sent it, the drafts it sent (version, nodes) and the refusals it got."""

    def __init__(self, *args, **kwargs):
        self.commits, self.sent, self.refusals, self.bases, self.contexts = [], [], [], [], []
        super().__init__(*args, **kwargs)

    def _on_commit(self, seq, commit):
        self.commits.append((commit.version, commit.draft_budget if commit.HasField("draft_budget") else None))
        self.bases.append(commit.base_version if commit.HasField("base_version") else None)
        super()._on_commit(seq, commit)
        self.contexts.append(list(seq.context))

    def _on_refusal(self, seq, refusal):
        self.refusals.append(refusal.kind)
        super()._on_refusal(seq, refusal)

    def _send(self, seq, tree, drafted=None, pipelined=False):
        self.sent.append((seq.version, tree.num_nodes))
        super()._send(seq, tree, drafted, pipelined)


class ScriptedBudget(SpeculationPolicy):
    """Budget 0 on steps in `off` (counted per verify step), no limit otherwise; trees pass uncut."""

    def __init__(self, off: range):
        super().__init__()
        self.off, self.num_steps = off, 0

    def cap(self) -> int:
        return 0 if self.num_steps in self.off else NO_CAP

    def allocate(self, keys, trees, sampled):
        return trees

    def record(self, keys, trees, steps, verify_s, draft_s=0.0, wait_s=0.0, timed=True):
        self.num_steps += 1


def test_drafting_resumes_after_a_zero_budget(tiny_models, reference):
    params = SamplingParams(max_new_tokens=40, ignore_eos=True)
    prompt = [11, 12, 13, 14, 15]
    want = reference("none", prompt, params).token_ids
    engine = Engine.from_pretrained(str(tiny_models["target"]), dtype="float32")
    worker = TargetWorker(engine, TargetConfig(draft_wait_s=5.0))
    worker.policy = ScriptedBudget(off=range(2, 6))
    server = start_server(lambda s: target_pb2_grpc.add_TargetWorkerServicer_to_server(TargetServicer(worker), s),
                          ["specdec.v1.TargetWorker"])
    draft_model = ModelRunner(load_model(tiny_models["draft"], torch.float32).model)  # a noisy copy: often right
    drafts = RecordingDraftWorker(DraftModelDrafter(draft_model), DraftConfig(drafter="draft", pipeline=False, adaptive=False, num_speculative_tokens=4))
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = target_pb2_grpc.TargetWorkerStub(channel)
            commits = stub.Admit(target_pb2.AdmitRequest(sequence_id="s", prompt_ids=prompt, expect_drafts=True,
                                                         params=params_to_pb(params)), timeout=60)
            assert next(commits).version == 0
            drafts.attach("s", server.address, prompt, params, timeout_s=60)
            steps = [c for c in commits]
        got = [t for c in steps for t in c.token_ids]
        assert got == want
        assert [c.version for c in steps] == list(range(1, len(steps) + 1))
        assert all(c.num_drafted == 0 for c in steps[2:6])  # the budget-0 steps verified nothing
        assert sum(c.num_accepted for c in steps[:2]) > 0  # drafts were accepted before the gap ...
        assert sum(c.num_accepted for c in steps[6:]) > 0  # ... and are again after it
        assert any(c.HasField("draft_budget") and c.draft_budget == 0 for c in steps)
        # the commits of versions 2-5 announced budget 0 for the steps on them: the draft worker heard the
        # first (version 2), drafted nothing on those versions, and got versions 3-6 in one catch-up commit
        # when the budget came back, its context then exactly the target's (no stale refusal to resync from)
        assert [(v, b) for v, b in drafts.commits if 2 <= v <= 5] == [(2, 0)]
        (six,) = [i for i, (v, _) in enumerate(drafts.commits) if v == 6]
        assert drafts.bases[six] == 2 and drafts.commits[six][1] is None
        assert drafts.contexts[six] == prompt + [t for c in steps[:6] for t in c.token_ids]
        assert not [v for v, nodes in drafts.sent if 2 <= v <= 5 and nodes > 0]
        assert any(v == 6 and n > 0 for v, n in drafts.sent)  # the budget came back: drafted at once
        assert target_pb2.Refusal.STALE not in drafts.refusals
    finally:
        drafts.stop()
        server.stop()
        worker.stop()
