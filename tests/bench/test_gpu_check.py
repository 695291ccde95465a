"""The GPU check's speedup model (numbers worked by hand) and its tiny CPU run (the code a GPU runs)."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from specdec.bench.speedup_model import acceptance_tail, best_speedup, cost_ratio, speedup

ROOT = Path(__file__).resolve().parents[2]


def test_acceptance_tail_from_the_histogram():
    # 10 drafted steps: 4 accepted nothing, 3 one token, 2 two, 1 three
    assert acceptance_tail([4, 3, 2, 1]) == [0.6, 0.3, 0.1]
    assert acceptance_tail([0, 0]) == []


def test_cost_ratio_interpolates_between_measured_rows():
    curve = {1: 10.0, 2: 11.0, 4: 13.0, 8: 20.0}
    assert cost_ratio(curve, 1) == 1.0
    assert cost_ratio(curve, 3) == pytest.approx(1.2)  # halfway from 11 to 13
    assert cost_ratio(curve, 6) == pytest.approx(1.65)
    assert cost_ratio(curve, 16) == pytest.approx(4.0)  # beyond the curve: proportional to rows


def test_speedup_formula():
    tail, curve = [0.6, 0.3, 0.1], {1: 10.0, 2: 11.0, 4: 13.0, 8: 20.0}
    # k = 2, every step drafted: E = 1 + 0.6 + 0.3 = 1.9; T = c(3)/c(1) = 1.2 -> 1.9 / 1.2
    assert speedup(tail, 1.0, curve, 2, 0.0) == pytest.approx(1.9 / 1.2)
    # half the steps drafted, a draft forward costing 0.1: E = 1 + 0.5 * 0.9, T = 0.5 + 0.5 * (1.2 + 0.2)
    assert speedup(tail, 0.5, curve, 2, 0.1) == pytest.approx(1.45 / 1.2)
    assert best_speedup(tail, 1.0, curve, 0.0) == (pytest.approx(1.9 / 1.2), 2)
    assert best_speedup([0.01], 1.0, curve, 0.5) == (1.0, 0)  # nothing pays: do not speculate


def import_gpu_check():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import gpu_check
    finally:
        sys.path.remove(str(ROOT / "benchmarks"))
    return gpu_check


def test_tiny_cpu_run(tmp_path):
    gpu_check = import_gpu_check()
    assert gpu_check.main(["--device", "cpu", "--tiny", "--skip", "grpc", "gtest", "--out", str(tmp_path)]) == 0
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    equality = result["sections"]["equality"]
    assert {r["drafter"] for r in equality} == {"plain", "prompt lookup", "random draft model",
                                                "noisy draft model, trees"}
    assert all(r["identical"] and r["batched_identical"] for r in equality)
    assert any(r["accepted"] > 0 for r in equality)  # the accept-and-commit path ran
    assert all(not r["graphs_active"] for r in equality if r["cuda_graphs"])  # a CPU: graphs fall back
    heads = result["sections"]["heads"]  # every drafter that needs the embedded target's shapes
    assert {r["drafter"] for r in heads} == {"suffix", "medusa", "hybrid (suffix + medusa)", "eagle", "eagle3"}
    assert all(r["identical"] for r in heads) and len(heads) == 10  # graphs off and on
    assert all(r["drafted"] > 0 for r in heads if r["drafter"] != "suffix")  # the heads loaded and drafted
    cost = result["sections"]["cost"]
    assert {(r["batch"], r["rows"]) for r in cost["rows"]} == {(b, n) for b in (1, 2) for n in (1, 2, 4)}
    assert all(r["eager_ms"] > 0 and r["graphs_ms"] is None for r in cost["rows"])
    assert cost["attention"] == "specdec" or cost["attention"] == "sdpa"  # a CPU: never the GPU's grouped one
    assert result["sections"]["cost_sdpa"]["attention"] == "sdpa"
    assert [(p["batch"], p["rows"]) for p in result["sections"]["profile"]] == [(1, 1), (8, 4), (32, 2)]
    plain, lookup = result["sections"]["decode"]
    assert (plain["drafter"], lookup["drafter"]) == ("none", "ngram") and not plain["graphs"]  # a CPU: eager
    assert plain["tau"] == 1.0 and plain["rows_per_forward"] == 1.0 and plain["ms_per_forward"] > 0
    assert lookup["rows_per_forward"] > 1.0  # the repeated prompt made prompt lookup draft
    assert "End to end on the same model" in (tmp_path / "gpu_check.md").read_text()
    drafters = {r["drafter"] for r in result["sections"]["speedup"]["rows"]}
    # every drafter the committed workload report measured that the model has a draft cost for
    measured = json.loads(gpu_check.ACCEPTANCE.read_text())["results"]["overall"]
    assert drafters and drafters == set(gpu_check.speedup_model.DRAFT_COST_RATIO) & set(measured)
    assert result["skipped"] == {"grpc": "--skip", "gtest": "--skip"}
    table = (tmp_path / "gpu_check.md").read_text()
    assert "| in process | noisy draft model, trees | off |" in table
    assert "| in process, SmolLM2-shaped | eagle3 | on |" in table and "Modelled speedup per drafter" in table


def test_a_section_that_raises_fails_the_check_and_the_rest_still_run(tmp_path, monkeypatch):
    gpu_check = import_gpu_check()

    def broken(*args, **kwargs):
        raise RuntimeError("no profiler here")

    monkeypatch.setattr(gpu_check.gpu_cost, "profile", broken)
    assert gpu_check.main(["--device", "cpu", "--tiny", "--skip", "equality", "heads", "grpc", "gtest", "--out",
                           str(tmp_path)]) == 1
    result = json.loads((tmp_path / "gpu_check.json").read_text())
    assert result["errors"] == {"profile": "RuntimeError: no profiler here"} and not result["ok"]
    assert "speedup" in result["sections"]  # ran after the failed one
    assert "Section profile FAILED: RuntimeError: no profiler here." in (tmp_path / "gpu_check.md").read_text()
