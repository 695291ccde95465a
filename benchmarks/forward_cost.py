"""Milliseconds per target forward against its row count, beside the memory-bandwidth floor.

    .venv/bin/python benchmarks/forward_cost.py            # rows 1-32, 256 and 1024 cached, batch 1 and 8
    .venv/bin/python benchmarks/forward_cost.py --quick    # rows 1, 8, 16; 256 cached; batch 1

A verify forward over k draft tokens must cost about what a one-token forward costs, or speculation
cannot pay. Each case fills a static KV cache with `context` tokens per sequence (untimed), then times
one forward of `rows` new tokens per sequence (causal, as a chain of drafts is verified) plus the LM
head over every row, and rolls the cache back; kernels alternate case by case so drift on a shared
machine hits both alike. Reported: the fastest and the median of `--repeats`. Kernels: `torch` (F.linear,
sdpa), `specdec-walk` (specdec's kernels under transformers' per-layer modules) and `specdec` (the same
kernels in the lean C++ walk, specdec.kernels.lean, where the model allows it).

The floor is the bytes every forward must read (each linear weight and the LM head once, in the
dtype) over the memory-stream rate measured here (a large tensor summed on torch's threads; measured
before every case, the fastest kept, as a neighbour's load on a shared machine only slows it). A
second floor adds the KV cache a one-row forward reads too (every layer's keys and values of the
cached tokens and the new one, per sequence): at 1,024 cached tokens that is no longer small. Many rows
meet the other roof (benchmarks/roofline.py): their FLOP at the vector units' measured peak. A forward's
floor is the larger of the two, and "floor 16 / floor 1" is the least 16 rows can cost against one row on
this machine, with any kernel (a goal below it cannot be met here). Writes
forward_cost.json, forward_cost.md and forward_cost.png under --out; the torch thread count is in all.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.bench.machine import machine_info, versions
from specdec.models.loader import DTYPES, load_model
from specdec.models.runner import ModelRunner, RunnerConfig

from roofline import arith_peak_gflops, forward_flops  # beside this script in benchmarks/

OUT = Path("benchmarks/results/forward_cost")


def stream_samples_gbs(num_bytes: int = 1 << 30, repeats: int = 5) -> list[float]:
    """The read rate of each of `repeats` sums of a float32 tensor far larger than any cache."""
    data = torch.ones(num_bytes // 4)
    data.sum()
    return [num_bytes / _timed(data.sum) / 1e9 for _ in range(repeats)]


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def weight_bytes(runner: ModelRunner) -> int:
    """Bytes a forward streams: every linear layer's weight and the LM head (tied or not), in their dtype."""
    from specdec.kernels.linear import PackedLinear

    total = runner.head_weight.numel() * runner.head_weight.element_size()
    for module in runner.decoder.modules():
        if isinstance(module, PackedLinear):
            total += module.out_features * module.in_features * module.packed.element_size()
        elif isinstance(module, torch.nn.Linear):
            total += module.weight.numel() * module.weight.element_size()
    return total


def kv_bytes_per_token(runner: ModelRunner) -> int:
    """Bytes of keys and values one cached token holds across all layers (what attention reads per token)."""
    config = runner.model.config
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    element = torch.finfo(runner.dtype).bits // 8
    return config.num_hidden_layers * 2 * config.num_key_value_heads * head_dim * element


def causal_bias(batch: int, rows: int, cached: int, dtype: torch.dtype) -> torch.Tensor:
    """[batch, 1, rows, cached + rows]: every past entry visible, the new rows causal among themselves."""
    bias = torch.zeros(rows, cached + rows, dtype=dtype)
    bias[:, cached:] = torch.full((rows, rows), torch.finfo(dtype).min, dtype=dtype).triu(1)
    return bias.expand(batch, 1, rows, cached + rows)


def filled_cache(runner: ModelRunner, batch: int, context: int):
    """A static cache holding `context` random tokens per sequence (prefilled in 256-token chunks)."""
    cache = runner.new_cache(context + 64)
    generator = torch.Generator().manual_seed(0)
    for start in range(0, context, 256):
        n = min(256, context - start)
        ids = torch.randint(0, runner.vocab_size, (batch, n), generator=generator)
        positions = torch.arange(start, start + n).expand(batch, n)
        runner.forward_batch(ids, cache, causal_bias(batch, n, start, runner.dtype), positions)
    return cache


def time_forward(runner: ModelRunner, cache, batch: int, context: int, rows: int) -> float:
    ids = torch.randint(0, runner.vocab_size, (batch, rows))
    positions = torch.arange(context, context + rows).expand(batch, rows)
    bias = causal_bias(batch, rows, context, runner.dtype)
    start = time.perf_counter()
    with torch.inference_mode():
        hidden = runner.forward_batch(ids, cache, bias, positions)
        runner.logits(hidden.reshape(batch * rows, -1))
    elapsed = time.perf_counter() - start
    cache.trim(context)
    return elapsed


def runner_config(kernel: str) -> RunnerConfig:
    """torch | specdec (the lean C++ walk where it runs) | specdec-walk (specdec's kernels under transformers'
    own per-layer walk, as before the lean forward)."""
    return RunnerConfig(linear_kernel=kernel.removesuffix("-walk"), lean_forward=not kernel.endswith("-walk"))


def time_rounds(runners: dict, caches: dict, batch: int, context: int, row_counts: list[int], repeats: int,
                bar=None) -> dict[tuple[str, int], list[float]]:
    """Seconds per forward, {(kernel, rows): [round 0 (warm-up), 1, ..]}: every row count and kernel once a round,
    round after round. A shared VM's memory can run at one rate for minutes and another for the next, so row counts
    timed one after the other (all of 1 row's repeats, then all of 8 rows') gave ratios of two rates as much as of two
    row counts: the session-33 grid put 16 / 1 rows at 1.57 while the same forwards taking turns measured 1.41."""
    times = {(kernel, rows): [] for kernel in runners for rows in row_counts}
    for _ in range(repeats + 1):  # the first round warms up
        for rows in row_counts:
            for kernel, runner in runners.items():
                times[kernel, rows].append(time_forward(runner, caches[kernel], batch, context, rows))
        if bar is not None:
            bar.update()
    return times


def measure(args: argparse.Namespace) -> dict:
    # re-measured before every case; the fastest seen is the floor's rate. The median is reported beside it:
    # a shared VM's memory can swing between two rates for minutes (an AMD EPYC host: ~34 and ~64 GB/s)
    samples = stream_samples_gbs()
    rate = max(samples)
    results, floors, kv_bytes, peaks = [], {}, {}, {}
    cases = [(c, b) for c in args.contexts for b in args.batches]
    bar = tqdm(total=len(args.dtypes) * len(cases) * (args.repeats + 1), desc="rounds", file=sys.stderr)
    for dtype_name in args.dtypes:
        # one model per kernel: a runner swaps its model's layers in place (specdec.kernels.linear)
        runners = {kernel: ModelRunner(load_model(args.target, DTYPES[dtype_name]).model, config=runner_config(kernel))
                   for kernel in args.kernels}
        for context, batch in cases:
            caches = {}
            samples += stream_samples_gbs()
            rate = max(samples)
            peak = arith_peak_gflops(DTYPES[dtype_name])  # like the stream: the fastest seen, before every case
            peaks[dtype_name] = peak and max(peak, peaks.get(dtype_name) or 0.0)
            for kernel, runner in runners.items():
                floors[dtype_name] = weight_bytes(runner)  # bytes here; ms at the end, at the fastest rate
                kv_bytes[dtype_name] = kv_bytes_per_token(runner)
                caches[kernel] = filled_cache(runner, batch, context)
            times = time_rounds(runners, caches, batch, context, args.rows, args.repeats, bar)
            for rows in args.rows:
                for kernel in runners:
                    ms = [1e3 * t for t in times[kernel, rows][1:]]
                    runner = runners[kernel]
                    flops = forward_flops(runner.model.config, floors[dtype_name] // runner.dtype.itemsize, batch,
                                          rows, context)
                    results.append(dict(dtype=dtype_name, kernel=runner.linear_kernel.kernel,
                                        asked=kernel, context=context, batch=batch, rows=rows,
                                        best_ms=round(min(ms), 2), median_ms=round(statistics.median(ms), 2),
                                        gflop=round(flops / 1e9, 3)))
        del runners, caches
    bar.close()
    return {"machine": machine_info(), "versions": versions(Path(".")), "threads": torch.get_num_threads(),
            "stream_rate_gbs": round(rate, 1), "stream_median_gbs": round(statistics.median(samples), 1),
            "num_stream_samples": len(samples), "floor_ms": {k: round(v / rate / 1e6, 2) for k, v in floors.items()},
            "kv_bytes_per_token": kv_bytes, "kv_ms_per_token": {k: v / rate / 1e6 for k, v in kv_bytes.items()},
            "peak_gflops": {k: v and round(v, 1) for k, v in peaks.items()},
            "repeats": args.repeats, "results": results}


def floor_with_kv_ms(report: dict, dtype: str, context: int, batch: int, rows: int = 1) -> float:
    """The weights' floor plus the KV cache a forward of `rows` new tokens reads (context + rows per sequence)."""
    return report["floor_ms"][dtype] + report["kv_ms_per_token"][dtype] * (context + rows) * batch


def floor_ms(report: dict, result: dict) -> float | None:
    """A timed forward's floor: its bytes (weights, and the K/V it reads) at the stream's rate, or its FLOP
    at the arithmetic peak, whichever is longer; None where no peak was measured (for a report before it)."""
    peak = report.get("peak_gflops", {}).get(result["dtype"])
    if not peak or "gflop" not in result:
        return None
    stream = floor_with_kv_ms(report, result["dtype"], result["context"], result["batch"], result["rows"])
    return max(stream, result["gflop"] / peak * 1e3)


def render_markdown(report: dict) -> str:
    m = report["machine"]
    rows = sorted({r["rows"] for r in report["results"]})
    lines = [f"CPU: {m['cpu']}; flags: {', '.join(m['cpu_flags'])}; {m['num_cpus']} CPUs, "
             f"{report['threads']} torch threads; load average {m.get('load_average_1m')} at the start. "
             f"Memory stream {report['stream_rate_gbs']} GB/s (the fastest of {report.get('num_stream_samples', '?')} sums; "
             f"their median {report.get('stream_median_gbs', '?')} GB/s); floors: "
             + ", ".join(f"{d} {v} ms" for d, v in report["floor_ms"].items())
             + f" (weights only); arithmetic peak: "
             + ", ".join(f"{d} {v} GFLOP/s" if v else f"{d} not measured" for d, v in report.get("peak_gflops", {}).items())
             + f". Fastest of {report['repeats']} (ms per forward incl. the LM head over every row); "
             "floor incl. K/V: the weights plus the keys and values a one-row forward reads; a forward's floor: "
             "that or its FLOP at the peak, whichever is longer.", "",
             "| dtype | kernel | cached | batch | " + " | ".join(f"{r} rows" for r in rows)
             + " | 1 row / floor | floor incl. K/V (ms) | 1 row / floor incl. K/V | 8 / 1 row | 16 / 1 row"
             " | floor 16 / floor 1 | 16 rows / their floor |",
             "|---|---|---|---|" + "---|" * (len(rows) + 7)]
    groups: dict = {}
    floors: dict = {}
    for r in report["results"]:
        groups.setdefault((r["dtype"], r["asked"], r["context"], r["batch"]), {})[r["rows"]] = r["best_ms"]
        floors.setdefault((r["dtype"], r["asked"], r["context"], r["batch"]), {})[r["rows"]] = floor_ms(report, r)
    for (dtype, kernel, context, batch), ms in groups.items():
        floor_of = floors[dtype, kernel, context, batch]
        least = f"{floor_of[16] / floor_of[1]:.2f}" if floor_of.get(16) and floor_of.get(1) else "-"
        to_own = f"{ms[16] / floor_of[16]:.2f}" if floor_of.get(16) else "-"
        one = ms.get(1)
        ratio = lambda n: f"{ms[n] / one:.2f}" if one and n in ms else "-"  # noqa: E731
        floor = report["floor_ms"][dtype]
        to_floor = f"{one / floor:.2f}" if one else "-"
        with_kv = floor_with_kv_ms(report, dtype, context, batch)
        to_kv = f"{one / with_kv:.2f}" if one else "-"
        lines.append(f"| {dtype} | {kernel} | {context} | {batch} | " + " | ".join(f"{ms.get(n, '-')}" for n in rows)
                     + f" | {to_floor} | {with_kv:.2f} | {to_kv} | {ratio(8)} | {ratio(16)} | {least} | {to_own} |")
    return "\n".join(lines) + "\n"


def render_png(report: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = sorted({(r["context"], r["batch"]) for r in report["results"]})
    fig, axes = plt.subplots(1, len(cases), figsize=(5 * len(cases), 4), squeeze=False)
    for ax, (context, batch) in zip(axes[0], cases):
        for dtype, kernel in sorted({(r["dtype"], r["asked"]) for r in report["results"]}):
            pts = sorted((r["rows"], r["best_ms"]) for r in report["results"]
                         if (r["dtype"], r["asked"], r["context"], r["batch"]) == (dtype, kernel, context, batch))
            ax.plot(*zip(*pts), marker="o", label=f"{dtype} {kernel}")
        for i, (dtype, floor) in enumerate(report["floor_ms"].items()):
            ax.axhline(floor, linestyle=":", color=f"C{i + 6}", label=f"{dtype} bandwidth floor")
            roof = sorted({(r["rows"], floor_ms(report, r)) for r in report["results"]
                           if (r["dtype"], r["context"], r["batch"]) == (dtype, context, batch)})
            if roof and all(ms is not None for _, ms in roof):  # the larger roof at each row count
                ax.plot(*zip(*roof), linestyle="--", color=f"C{i + 6}", label=f"{dtype} floor (stream or peak)")
        ax.set(xscale="log", xlabel="rows per sequence", ylabel="ms per forward", ylim=(0, None),
               title=f"{context} cached, batch {batch}")
        ax.set_xticks(sorted({r['rows'] for r in report['results']}), labels=None)
        ax.get_xaxis().set_major_formatter(matplotlib.ticker.ScalarFormatter())
    axes[0][0].legend(fontsize=7)
    fig.suptitle(f"{report['machine']['cpu']} ({', '.join(report['machine']['cpu_flags'])}), "
                 f"{report['threads']} torch threads", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target", default=None, help="checkpoint dir (default: the embedded SmolLM2-135M)")
    p.add_argument("--quick", action="store_true", help="rows 1, 8, 16; 256 cached; batch 1; 3 repeats")
    p.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    p.add_argument("--contexts", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"])
    kernels = ["torch", "specdec-walk", "specdec"]
    p.add_argument("--kernels", nargs="+", default=kernels, choices=kernels)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    p.add_argument("--out", default=str(OUT))
    args = p.parse_args(argv)
    if args.quick:
        args.rows, args.contexts, args.batches, args.repeats = [1, 8, 16], [256], [1], 3
    if args.threads < 0:
        p.error("--threads must be 0 (torch's default) or more")
    torch.set_num_threads(args.threads or torch.get_num_threads())
    info = machine_info()
    print(f"CPU: {info['cpu']}; flags: {', '.join(info['cpu_flags'])}; torch threads {torch.get_num_threads()}",
          file=sys.stderr)
    report = measure(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "forward_cost.json").write_text(json.dumps(report, indent=1))
    table = render_markdown(report)
    (out / "forward_cost.md").write_text(table)
    render_png(report, out / "forward_cost.png")
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
