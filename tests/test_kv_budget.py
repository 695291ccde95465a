"""The target's KV budget: the GPU arithmetic (checked with numbers, as no GPU is here) and the CPU rule."""
from __future__ import annotations

import pytest

from specdec import Engine
from specdec.errors import InvalidArgument
from specdec.kv_budget import KvBudget, bytes_per_token, gpu_kv_tokens, plan

GIB = 2 ** 30


def test_bytes_per_token_of_an_8b_llama():
    # 32 layers, 8 key-value heads of 128, bf16: keys and values = 128 KiB a token; a rank of 2 holds half the heads
    assert bytes_per_token(32, 8, 128, 2) == 131072
    assert bytes_per_token(32, 8, 128, 2, tp_degree=2) == 65536


def test_gpu_tokens_are_what_the_fraction_leaves():
    # an H200 (141 GiB) at 0.9, 17 GiB in use after loading (weights + context), 2 GiB for a step's activations
    tokens = gpu_kv_tokens(141 * GIB, 17 * GIB, 2 * GIB, 0.9, 131072)
    assert tokens == (int(141 * GIB * 0.9) - 19 * GIB) // 131072 == 883916  # ~108 GiB of 128 KiB tokens
    assert gpu_kv_tokens(141 * GIB, 17 * GIB, 2 * GIB, 0.5, 131072) < tokens  # a smaller share, a smaller cache


def test_a_fraction_that_leaves_nothing_is_refused():
    with pytest.raises(InvalidArgument, match=r"--gpu-memory-fraction 0.1 of 141.0 GiB leaves no room for a KV "
                                              r"cache: 17.00 GiB in use after loading"):
        gpu_kv_tokens(141 * GIB, 17 * GIB, 2 * GIB, 0.1, 131072)


def test_cpu_keeps_the_configured_rule(tiny_target):
    engine = Engine.from_pretrained(target=tiny_target, device="cpu")
    assert engine.max_len == 512
    token_bytes = bytes_per_token(2, 2, 16, 4)  # the tiny model: 2 layers, 2 kv heads of 16, float32
    assert plan(engine, max_sequences=4, max_kv_tokens=0, max_batch=8, gpu_memory_fraction=0.9) == \
        KvBudget(4 * 512, "context", token_bytes)
    assert plan(engine, max_sequences=4, max_kv_tokens=1000, max_batch=8, gpu_memory_fraction=0.9) == \
        KvBudget(1000, "max_kv_tokens", token_bytes)


def test_the_worker_serves_its_budget(tiny_target):
    from specdec.serving_config import TargetConfig
    from target_service.worker import TargetWorker

    engine = Engine.from_pretrained(target=tiny_target, device="cpu")
    worker = TargetWorker(engine, TargetConfig(model=tiny_target, max_sequences=3))
    try:
        assert worker.kv_budget.source == "context" and worker.kv_figures().capacity_tokens == 3 * 512
    finally:
        worker.stop()
