"""Shared fixtures: a tiny random target/draft pair (fast, no tokenizer) and the embedded SmolLM2."""
from __future__ import annotations

import os

import specdec  # noqa: F401  (sets OMP_WAIT_POLICY before torch starts OpenMP)
import pytest
import torch

os.environ.setdefault("HF_HUB_OFFLINE", "1")

TINY_VOCAB = 96


def make_tiny_llama(path, seed: int, hidden: int = 64, layers: int = 2, vocab: int = TINY_VOCAB,
                    eos_token_id: int | None = None):
    """A random Llama checkpoint dir. A large initializer range gives logits clear margins, so
    argmax is not decided by float rounding (what greedy equality across batch shapes needs)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         initializer_range=0.5, eos_token_id=eos_token_id, bos_token_id=None, pad_token_id=None)
    model = LlamaForCausalLM(config)
    model.generation_config.eos_token_id = eos_token_id
    model.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny-target"), seed=1))


@pytest.fixture(scope="session")
def tiny_draft(tmp_path_factory):
    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny-draft"), seed=2, hidden=32, layers=1))


@pytest.fixture(scope="session")
def tiny_noisy_draft(tiny_target, tmp_path_factory):
    """The tiny target plus weight noise: accepts often, but not always (sampling tests need both)."""
    from e2e.tiny import make_noisy_copy
    from pathlib import Path

    return str(make_noisy_copy(Path(tiny_target), tmp_path_factory.mktemp("tiny-noisy") / "m", noise=0.05, seed=3))


@pytest.fixture(scope="session")
def smol_path():
    from specdec.models.embedded import embedded_target_path

    return str(embedded_target_path())


@pytest.fixture
def one_thread():
    """Tiny models: one intra-op thread. Two spin-waiting OpenMP threads cost far more than they
    save on 64-wide matmuls, and starve neighbouring processes (the e2e servers)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# Modules whose tests assert wall-clock bounds (a refusal "at once", an inter-token gap, a draft wait), or
# start something whose own deadline is fixed (a Ray node's raylet must register within Ray's hard-coded
# 30 s: beside another module's forwards on 2 cores it once did not). `make test` runs every other module
# two at a time (pytest-xdist, one file per worker) and these afterwards, alone, so a neighbour's import or
# forward cannot eat their budget.
SERIAL_MODULES = frozenset({
    "test_admission_flood", "test_chunked_prefill", "test_draft_death", "test_hostile_inputs",
    "test_router_batching", "test_step_faults", "test_router_admission", "test_drain", "test_deploy_ray",
})


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.module.__name__.rpartition(".")[2] in SERIAL_MODULES:
            item.add_marker(pytest.mark.serial)
