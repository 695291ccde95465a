"""benchmarks/dtype_divergence.py: bf16 against float32 plain decoding of one checkpoint, question by question."""
from __future__ import annotations

import json

import pytest

from bench.test_roofline import import_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


def test_summary_counts_the_questions_that_part_and_where():
    divergence = import_benchmark("dtype_divergence")
    records = [{"flip": None}, {"flip": {"position": 9, "top2_gap": 0.5}}, {"flip": {"position": 3, "top2_gap": 0.1}}]
    assert divergence.summarize(records) == {"questions": 3, "parted": 2, "median_position": 6.0, "positions": [3, 9],
                                             "median_gap": 0.3}
    assert divergence.summarize([{"flip": None}])["median_position"] is None


def test_runs_both_dtypes_on_a_checkpoint_and_writes_its_report(chat_models, question_file, tmp_path):
    divergence = import_benchmark("dtype_divergence")
    target, _ = chat_models
    out = tmp_path / "divergence"
    assert divergence.main(["--questions", str(question_file), "--per-category", "1", "--max-new-tokens", "6",
                            "--target", target, "--threads", "1", "--out", str(out)]) == 0
    report = json.loads((out / "report.json").read_text())
    categories = {r["category"] for r in report["records"]}
    assert len(report["records"]) == len(categories) == report["summary"]["questions"] >= 4
    parted = [r for r in report["records"] if r["flip"] is not None]
    assert report["summary"]["parted"] == len(parted)
    assert all(0 <= r["flip"]["position"] <= 6 and r["flip"]["top2_gap"] >= 0 for r in parted)
