"""benchmarks/forward_ab.py: two trees' whole forwards taking turns, rows / one row per tree, logits compared."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.test_roofline import import_benchmark

ROOT = str(Path(__file__).resolve().parents[2])


def test_a_tree_against_itself_gives_times_and_ratios_per_row_count_and_equal_logits(capsys):
    forward_ab = import_benchmark("forward_ab")
    assert forward_ab.main(["--trees", ROOT, ROOT, "--dtype", "float32", "--context", "24", "--rows", "2", "1",
                            "--forwards", "2", "--warmup", "1", "--turns", "2", "--pairs", "1"]) == 0
    out = capsys.readouterr().out
    assert "float32, 24 cached, rows 1 2, 2 timed rounds a turn" in out
    table = dict((int(m[0]), m[1:]) for m in re.findall(
        r"^\| (\d+) \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d+) \| (\d+\.\d+) \|$", out, re.MULTILINE))
    assert set(table) == {1, 2}
    assert table[1][3:] == ("1.000", "1.000")  # the base row count against itself
    a_ms, b_ms, b_over_a = (float(x) for x in table[2][:3])
    assert a_ms > 0 and b_ms > 0 and abs(b_over_a - b_ms / a_ms) < 0.05  # ms printed to 2 decimals


def test_bad_counts_are_refused(capsys):
    forward_ab = import_benchmark("forward_ab")
    with pytest.raises(SystemExit) as exc:
        forward_ab.main(["--trees", ROOT, ROOT, "--turns", "0"])
    assert exc.value.code == 2 and "--turns" in capsys.readouterr().err


def test_different_bits_fail_the_run_unless_allowed(capsys):
    ab_turns = import_benchmark("ab_turns")
    assert ab_turns.bits_verdict([True, True], False, "differ") == 0
    assert ab_turns.bits_verdict([True, False], True, "differ") == 0
    assert capsys.readouterr().err == ""
    assert ab_turns.bits_verdict([True, False], False, "forward_ab: A and B gave different logits") == 1
    assert "different logits" in capsys.readouterr().err
