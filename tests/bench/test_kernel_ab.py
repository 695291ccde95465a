"""benchmarks/kernel_ab.py: two trees' attention kernels taking turns, pair by pair, outputs compared bit for bit."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

from bench.test_roofline import import_benchmark
from specdec.kernels.build import load_kernel

pytestmark = pytest.mark.skipif(load_kernel().module is None, reason="the kernels do not build here")
ROOT = str(Path(__file__).resolve().parents[2])


def test_a_tree_against_itself_gives_a_ratio_per_pair_and_equal_bits(capsys):
    kernel_ab = import_benchmark("kernel_ab")
    assert kernel_ab.main(["--trees", ROOT, ROOT, "--rows", "3", "--keys", "40", "--pairs", "2", "--turns", "4",
                           "--dtype", "float32"]) == 0
    out = capsys.readouterr().out
    assert "3 rows over 40 cached keys" in out
    ratios = [float(r) for r in re.findall(r"B/A (\d+\.\d+)", out)]
    assert len(ratios) == 2 and all(0.2 < r < 5.0 for r in ratios)
    assert re.search(r"B/A median of 2 pairs: \d+\.\d+ \(pairs \d+\.\d+-\d+\.\d+\)", out)
