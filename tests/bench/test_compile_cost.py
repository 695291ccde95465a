"""benchmarks/compile_cost.py's table: one line per mode, compile seconds only where something compiled."""
from __future__ import annotations

from bench.test_roofline import import_benchmark


def test_table_has_each_mode_and_the_compile_seconds_per_row_count():
    compile_cost = import_benchmark("compile_cost")
    results = [{"mode": mode, "rows": rows, "fastest_ms": ms, "median_ms": ms + 1}
               for mode, base in (("eager", 30.0), ("torch.compile", 25.0), ("specdec", 15.0))
               for rows, ms in ((1, base), (16, 2 * base))]
    report = {"machine": "cpu", "dtype": "float32", "context": 256, "threads": 2, "repeats": 3,
              "command": "python benchmarks/compile_cost.py", "compile_s": {"1": 20.5, "16": 22.0}, "results": results}
    table = compile_cost.render_markdown(report).splitlines()
    assert table[2] == "| mode | 1 rows | 16 rows | compile (s) |"
    assert table[4:] == ["| eager | 30.0 (31.0) | 60.0 (61.0) | - |",
                         "| torch.compile | 25.0 (26.0) | 50.0 (51.0) | 20.5 / 22.0 |",
                         "| specdec | 15.0 (16.0) | 30.0 (31.0) | - |"]
