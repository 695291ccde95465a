"""benchmarks/budget_calibration.py: the batch budget's promise against what the steps got, in all and by depth."""
from __future__ import annotations

import pytest

from bench.test_roofline import import_benchmark

pytestmark = pytest.mark.usefixtures("one_thread")


def test_by_depth_sums_promises_and_counts_the_paths_that_reached_each_depth():
    calibration = import_benchmark("budget_calibration")
    trees = [([(1, 0.9), (2, 0.5), (1, 0.2)], 2),  # a branch at depth 1; the path reached depth 2
             ([(1, 0.8), (2, 0.6), (3, 0.4)], 1),  # a chain accepted to depth 1
             ([(1, 0.5)], 3)]  # counted to the tree's own depth at most
    got = calibration.by_depth(trees)
    assert {d: (round(p, 6), n) for d, (p, n) in got.items()} == {1: (2.4, 3), 2: (1.1, 1), 3: (0.4, 0)}
    assert calibration.by_depth([]) == {}


def test_runs_a_drafter_against_plain_on_a_checkpoint(chat_models, capsys):
    calibration = import_benchmark("budget_calibration")
    target, _ = chat_models
    assert calibration.main(["--drafter", "ngram", "--target", target, "--dtype", "float32", "--batch", "2",
                             "--prompts", "4", "--max-new-tokens", "12"]) == 0
    out = capsys.readouterr().out
    assert "tokens/s: ngram" in out and "ngram against plain, batches of 2, 4 prompts, float32" in out
    assert "by depth (" in out and "| depth | promised | got | got / promised |" in out
