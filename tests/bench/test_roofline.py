"""The roofline's arithmetic (numbers worked by hand) and the register-only peak it is drawn from."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from specdec.kernels.build import load_kernel

ROOT = Path(__file__).resolve().parents[2]


def import_benchmark(name: str):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        return __import__(name)
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))


def test_forward_flops_counts_products_and_attention():
    roofline = import_benchmark("roofline")
    config = SimpleNamespace(hidden_size=64, num_attention_heads=4, num_hidden_layers=2)  # head_dim 16
    # per row: 2 x 1000 weights, and per layer and head 4 x 16 x (10 cached + 3 new) for q.k and p.v
    per_row = 2 * 1000 + 4 * 2 * 4 * 16 * 13
    assert roofline.forward_flops(config, 1000, batch=2, rows=3, context=10) == 2 * 3 * per_row
    config.head_dim = 8  # an explicit head_dim wins over hidden / heads
    assert roofline.forward_flops(config, 0, batch=1, rows=1, context=0) == 4 * 2 * 4 * 8 * 1


def test_roofs_cross_where_products_take_as_long_as_the_stream():
    roofline = import_benchmark("roofline")
    # bf16: 2 bytes and 2 FLOP a weight a row; 460 GFLOP/s against 46 GB/s: 10 rows
    assert roofline.crossover_rows(2, 46.0, 460.0) == pytest.approx(10.0)
    assert roofline.crossover_rows(4, 46.0, 230.0) == pytest.approx(10.0)  # float32: twice the bytes, half the rate


def test_a_forwards_floor_is_the_larger_roof():
    forward_cost = import_benchmark("forward_cost")
    report = {"floor_ms": {"bfloat16": 5.0}, "kv_ms_per_token": {"bfloat16": 0.001},
              "peak_gflops": {"bfloat16": 400.0}}
    one = dict(dtype="bfloat16", context=255, batch=1, rows=1, gflop=0.27)
    many = dict(one, rows=33, gflop=8.8)
    assert forward_cost.floor_ms(report, one) == pytest.approx(5.0 + 0.256)  # the stream: weights and K/V
    assert forward_cost.floor_ms(report, many) == pytest.approx(22.0)  # the arithmetic: 8.8 GFLOP at 400
    assert forward_cost.floor_ms({**report, "peak_gflops": {"bfloat16": None}}, many) is None
    assert forward_cost.floor_ms(report, {k: v for k, v in many.items() if k != "gflop"}) is None  # older reports


def test_row_counts_take_turns_round_by_round(monkeypatch):
    forward_cost = import_benchmark("forward_cost")
    calls = []
    monkeypatch.setattr(forward_cost, "time_forward",
                        lambda runner, cache, batch, context, rows: calls.append((runner, rows)) or len(calls))
    times = forward_cost.time_rounds({"specdec": "r1", "torch": "r2"}, {"specdec": None, "torch": None}, 1, 256,
                                     [1, 8, 16], repeats=2)
    one_round = [("r1", 1), ("r2", 1), ("r1", 8), ("r2", 8), ("r1", 16), ("r2", 16)]
    assert calls == one_round * 3  # a warm-up round, then two: never all of one row count's repeats in a row
    assert times["specdec", 8] == [3, 9, 15] and times["torch", 16] == [6, 12, 18]


@pytest.mark.skipif(load_kernel().module is None, reason="the kernels did not build here")
@pytest.mark.parametrize("bf16", [False, True])
def test_the_arithmetic_peak_is_a_rate(bf16):
    module = load_kernel().module
    rate = module.arith_peak(bf16, 200_000)
    # GFLOP/s: even one AVX2 core at 1 GHz does 32, and no CPU of a few cores does 100,000 (a loop the
    # compiler had dropped would report about that: the work counted, none of its time spent)
    assert math.isfinite(rate) and 1.0 < rate < 1e5
    with pytest.raises(RuntimeError, match="iters > 0"):
        module.arith_peak(bf16, 0)
    peak = import_benchmark("roofline").arith_peak_gflops(torch.bfloat16 if bf16 else torch.float32, samples=1)
    if bf16 and load_kernel().isa == "amx_bf16":  # bf16 products run on AMX tiles, which the loop does not time
        assert peak is None
    else:
        assert peak > 1.0
