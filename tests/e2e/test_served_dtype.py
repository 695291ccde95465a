"""dtype auto in the servers: a checkpoint stored in bfloat16 is served in bf16 where this CPU multiplies it natively
(float32 elsewhere), the workers say which, and greedy output through router -> draft worker -> target equals the
in-process engine's plain decoding of that checkpoint in the same dtype."""
from __future__ import annotations

import shutil

import grpc
import pytest
import torch

from e2e.harness import READY_TIMEOUT_S, running_stack
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.kernels.build import load_kernel
from specdec.rpc.v1 import common_pb2, draft_pb2_grpc, target_pb2_grpc
from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig

pytestmark = pytest.mark.e2e
GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)
PROMPTS = [[5, 17, 99, 3, 5, 17, 99, 3, 5, 17], "Once upon a time, in a land far away"]


@pytest.fixture(scope="module")
def bf16_target(tiny_models, tmp_path_factory):
    """The e2e tiny target (SmolLM2's tokenizer) saved in bfloat16: its config's dtype says bfloat16."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-bf16") / "target"
    LlamaForCausalLM.from_pretrained(tiny_models["target"], dtype=torch.bfloat16).save_pretrained(out)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        if (tiny_models["target"] / name).exists():
            shutil.copy(tiny_models["target"] / name, out / name)
    return out


def test_a_bf16_checkpoint_is_served_in_the_dtype_auto_picks_and_stays_exact(bf16_target):
    from specdec.engine import Engine

    config = StackConfig(router=RouterConfig(max_active=4, max_queue=4),
                         targets=(TargetConfig(model=str(bf16_target), num_threads=1),),  # dtype: the default, auto
                         drafts=(DraftConfig(drafter="ngram", target_model=str(bf16_target), num_threads=1),),
                         ready_timeout_s=READY_TIMEOUT_S)
    want = "bfloat16" if load_kernel().native_bf16 else "float32"
    torch.set_num_threads(1)
    plain = Engine.from_pretrained(str(bf16_target))  # auto in process too: the same choice
    assert str(plain.runner.dtype) == f"torch.{want}"
    with running_stack(config) as stack:
        with grpc.insecure_channel(stack.targets[0].address) as channel:
            info = target_pb2_grpc.TargetWorkerStub(channel).GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)
        assert info.dtype == want
        with grpc.insecure_channel(stack.drafts[0].address) as channel:
            draft = draft_pb2_grpc.DraftWorkerStub(channel).GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)
        assert draft.dtype == ""  # prompt lookup has no model
        with Client(stack.address) as client:
            for prompt in PROMPTS:
                assert client.generate(prompt, GREEDY, timeout_s=60).token_ids == plain.generate(prompt, GREEDY).token_ids
