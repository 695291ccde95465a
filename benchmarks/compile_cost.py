"""torch.compile against specdec's kernels: milliseconds per target forward, and what compiling costs.

    .venv/bin/python benchmarks/compile_cost.py --rows 1 8 16 --context 256 --repeats 10 --threads 2

Three ways to run the same forward (a static cache holding `context` tokens, `rows` new ones, the LM head
over every row; forward_cost.py's harness): transformers' walk on torch's kernels (`eager`), the same walk
with its decoder compiled by inductor (`torch.compile`, freezing on, one compile per row count: its
seconds are reported), and specdec's lean forward on its row-invariant kernels (`specdec`, what the
engine runs on a CPU). Forwards take turns round by round so the VM's drifting memory hits all alike.
The engine uses torch.compile nowhere on CPUs: this is the measurement that says why.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from forward_cost import filled_cache, runner_config, time_forward, time_rounds

OUT = Path(__file__).resolve().parent / "results" / "compile_cost"


def measure(args: argparse.Namespace) -> dict:
    import torch._inductor.config as inductor_config

    from specdec.bench.machine import cpu_info
    from specdec.models.loader import load_model
    from specdec.models.runner import ModelRunner

    torch.set_num_threads(args.threads)
    inductor_config.freezing = True  # weights as constants: inductor may pre-pack them for its GEMMs
    dtype = getattr(torch, args.dtype)
    runners = {name: ModelRunner(load_model(args.target, dtype).model, config=runner_config(kernel))
               for name, kernel in (("eager", "torch"), ("torch.compile", "torch"), ("specdec", "specdec"))}
    caches = {name: filled_cache(runner, 1, args.context) for name, runner in runners.items()}
    compiled = runners["torch.compile"].decoder
    compiled.forward = torch.compile(compiled.forward, dynamic=False)
    compile_s = {}
    for rows in args.rows:  # the first call of each shape compiles it
        began = time.perf_counter()
        time_forward(runners["torch.compile"], caches["torch.compile"], 1, args.context, rows)
        compile_s[rows] = round(time.perf_counter() - began, 1)
        print(f"torch.compile, {rows} rows: first call (compile) {compile_s[rows]} s", flush=True)
    times = time_rounds(runners, caches, 1, args.context, args.rows, args.repeats)  # round 0 warms up
    results = [{"mode": name, "rows": rows, "fastest_ms": round(min(t[1:]) * 1e3, 2),
                "median_ms": round(statistics.median(t[1:]) * 1e3, 2)} for (name, rows), t in times.items()]
    return {"machine": cpu_info(), "command": "python " + " ".join(sys.argv), "dtype": args.dtype,
            "context": args.context, "threads": args.threads, "repeats": args.repeats,
            "compile_s": compile_s, "results": results}


def render_markdown(report: dict) -> str:
    rows = sorted({r["rows"] for r in report["results"]})
    modes = list(dict.fromkeys(r["mode"] for r in report["results"]))
    at = {(r["mode"], r["rows"]): r for r in report["results"]}
    lines = [f"{report['machine']}; {report['dtype']}, {report['context']} cached, {report['threads']} threads; "
             f"fastest (median) of {report['repeats']} ms per forward incl. the LM head; `{report['command']}`", "",
             "| mode | " + " | ".join(f"{n} rows" for n in rows) + " | compile (s) |",
             "|---|" + "---|" * (len(rows) + 1)]
    for mode in modes:
        cells = [f"{at[mode, n]['fastest_ms']} ({at[mode, n]['median_ms']})" for n in rows]
        compile_s = (" / ".join(str(report["compile_s"][str(n)] if str(n) in report["compile_s"]
                                    else report["compile_s"][n]) for n in rows) if mode == "torch.compile" else "-")
        lines.append(f"| {mode} | " + " | ".join(cells) + f" | {compile_s} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="checkpoint dir (default: the embedded SmolLM2-135M)")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16])
    p.add_argument("--context", type=int, default=256)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--repeats", type=int, default=10)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    report = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "compile_cost.json").write_text(json.dumps(report, indent=1))
    markdown = render_markdown(report)
    (out / "compile_cost.md").write_text(markdown)
    print(markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
