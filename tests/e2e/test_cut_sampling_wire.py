"""Sampled output over gRPC keeps the target's distribution when the target cuts drafts to its budget.

A real target worker and draft worker (width-2 trees, pipelining on) on 127.0.0.1, in process so the
policy can be forced deterministically: the first budget is 5 nodes and by the given costs 3 pay, so
the draft worker is told 5 then 4 nodes, and its pipelined drafts (drafted before a budget was
announced) are cut by the target to the announced prefix. G-test of the first two tokens against the
exact joint distribution."""
from __future__ import annotations

import dataclasses

import grpc
import torch

from distribution import assert_follows, exact_joint, target_next_probs
from draft_service.worker import DraftWorker
from specdec.core.types import SamplingParams
from specdec.drafters.draft_model import DraftModelConfig, DraftModelDrafter
from specdec.engine import Engine
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner
from specdec.policy import PolicyConfig
from specdec.policy.budget import BudgetConfig
from specdec.rpc.convert import params_to_pb
from specdec.rpc.server import start_server
from specdec.rpc.v1 import target_pb2, target_pb2_grpc
from specdec.serving_config import DraftConfig, TargetConfig
from target_service.server import TargetServicer
from target_service.worker import TargetWorker

NUM_DRAWS = 400
PROMPT = [21, 22, 23, 24, 25]
PARAMS = SamplingParams(temperature=1.0, top_k=6, max_new_tokens=4, ignore_eos=True)
FORCED = PolicyConfig(max_depth=3, adaptive=False, load_aware=True, budget=BudgetConfig(
    costs=((1, 1.0), (4, 1.0), (5, 100.0)), learn_costs=False, first_budget=5, min_probe_interval=1 << 20))


def test_draft_worker_trees_cut_by_the_target(tiny_models):
    torch.set_num_threads(1)
    engine = Engine.from_pretrained(str(tiny_models["target"]), dtype="float32", num_speculative_tokens=3)
    engine.config = dataclasses.replace(engine.config, policy=FORCED)
    worker = TargetWorker(engine, TargetConfig(draft_wait_s=5.0, max_batch=8))
    server = start_server(lambda s: target_pb2_grpc.add_TargetWorkerServicer_to_server(TargetServicer(worker), s),
                          ["specdec.v1.TargetWorker"])
    runner = ModelRunner(load_model(tiny_models["draft"], torch.float32).model)
    drafts = DraftWorker(DraftModelDrafter(runner, DraftModelConfig(tree_width=2, q_top_n=32)),
                         DraftConfig(drafter="draft", pipeline=True, pipeline_min_hit=0.0, adaptive=False,
                                     num_speculative_tokens=3))
    samples: list[tuple[int, ...]] = []
    drafted = accepted = num_cut = 0
    try:
        with grpc.insecure_channel(server.address) as channel:
            stub = target_pb2_grpc.TargetWorkerStub(channel)
            for n in range(NUM_DRAWS):
                seq_id = f"s{n}"
                commits = stub.Admit(target_pb2.AdmitRequest(sequence_id=seq_id, prompt_ids=PROMPT, expect_drafts=True,
                                                             params=params_to_pb(PARAMS)), timeout=60)
                next(commits)
                drafts.attach(seq_id, server.address, PROMPT, PARAMS, timeout_s=60)
                steps = list(commits)
                tokens = [t for c in steps for t in c.token_ids]
                samples.append(tuple(tokens[:2]))
                drafted += sum(c.num_drafted for c in steps)
                accepted += sum(c.num_accepted for c in steps)
                # within the budget the previous commit announced (none: no limit); a full tree has 10
                for before, step in zip(steps, steps[1:]):
                    assert not before.HasField("draft_budget") or step.num_drafted <= before.draft_budget
                num_cut += sum(0 < c.num_drafted < 10 for c in steps)
    finally:
        drafts.stop()
        server.stop()
        worker.stop()
    assert 0 < accepted < drafted
    assert num_cut > NUM_DRAWS  # budgets really cut the trees (told before drafting, or cut by the target)
    assert_follows(samples, exact_joint(target_next_probs(tiny_models["target"], PARAMS), PROMPT))
