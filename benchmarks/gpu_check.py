"""The GPU check: what only a GPU can show, in one run of at most 8 minutes on one H200, offline.

    python benchmarks/gpu_check.py --out benchmarks/results/gpu          # a GPU machine (device cuda)
    python benchmarks/gpu_check.py --device cpu --tiny --out /tmp/gpu    # the same code on a CPU, tiny sizes

Needs no network and no model from a package: every model is built from a transformers config with
random weights. On a machine without a package index, first `make gpu-wheels` (on a machine with one)
and carry vendor/gpu-wheels along (~25 MB); there `pip install --no-index --no-deps --find-links
vendor/gpu-wheels --target .gpu-site -r vendor/gpu-wheels/requirements.txt` and run with
PYTHONPATH=.gpu-site:. (the machine brings torch with CUDA, transformers, tokenizers, safetensors, pyyaml;
grpcio and protobuf come along pinned, as the committed stubs need them).

Sections (each timed; one that would start past --budget-s is skipped and says so):
  equality  greedy tokens of prompt lookup and a random draft model equal plain decoding, in process
            (alone and batched), CUDA graphs off and on
  heads     the same for suffix decoding, the shipped Medusa, EAGLE and EAGLE-3 heads and the hybrid, on
            a random-weight target of SmolLM2-135M's shapes (specdec/bench/gpu_heads.py)
  grpc      the same prompts through the gRPC stack on 127.0.0.1 (prompt lookup, a draft model)
  gtest     the first two sampled tokens (a draft model drafting chains) against the exact joint
  cost      ms of one verify forward of an 8B-shaped Llama (bf16, random weights) against rows 1..64
            and batch 1..32, eager and graphed, and the ratio to the one-row step
  cost_sdpa the same with transformers' sdpa attention in place of specdec.kernels.grouped (the A/B)
  profile   the costliest kernels of a graphed forward at a few (batch, rows), from torch.profiler
  decode    end to end on the same model: plain decoding and prompt lookup, ms per target forward
            against the forward alone (what a step costs beyond it)
  speedup   each drafter's speedup on that cost curve with its acceptance measured on the CPU with the
            real model (benchmarks/results/workloads/report.json), as the model in
            specdec/bench/speedup_model.py
Writes gpu_check.json and gpu_check.md (the README's table) to --out; exits 1 if an exactness check failed
or a section raised (its error is in both files; the other sections still run).
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from specdec.bench import gpu_checks, gpu_cost, gpu_heads, speedup_model  # noqa: E402
from specdec.bench.gpu_report import markdown  # noqa: E402
from specdec.bench.machine import machine_info, versions  # noqa: E402

SECTIONS = ("equality", "heads", "grpc", "gtest", "cost", "cost_sdpa", "profile", "decode", "speedup")
ACCEPTANCE = ROOT / "benchmarks" / "results" / "workloads" / "report.json"


def speedups(cost: dict, acceptance_path: Path, batches=(1, 8, 32)) -> dict:
    """Each drafter's best speedup per batch and mode from the cost curve (see speedup_model)."""
    report = json.loads(acceptance_path.read_text())
    overall = report["results"]["overall"]
    rows = []
    for drafter, draft_ratio in speedup_model.DRAFT_COST_RATIO.items():
        if drafter not in overall:
            continue
        tail = speedup_model.acceptance_tail(overall[drafter]["accepted_length_histogram"])
        share = overall[drafter]["drafted_step_share"]
        for batch in batches:
            for mode in ("eager", "graphs"):
                curve = {r["rows"]: r[f"{mode}_ms"] for r in cost["rows"] if r["batch"] == batch}
                if not curve or None in curve.values():
                    continue
                best, depth = speedup_model.best_speedup(tail, share, curve, draft_ratio)
                rows.append({"drafter": drafter, "batch": batch, "mode": mode, "speedup": round(best, 3),
                             "depth": depth, "drafted_step_share": round(share, 3),
                             "p_accept_ge": [round(p, 3) for p in tail[:4]], "draft_cost_ratio": draft_ratio})
    return {"acceptance_from": str(acceptance_path.relative_to(ROOT)),
            "acceptance_machine": report.get("machine", {}).get("cpu"),
            "acceptance_target": report.get("settings", {}).get("target"), "rows": rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tiny", action="store_true", help="tiny models and sweeps (a CPU run of the same code)")
    parser.add_argument("--out", default="benchmarks/results/gpu")
    parser.add_argument("--skip", nargs="*", default=[], choices=SECTIONS)
    parser.add_argument("--budget-s", type=float, default=480.0, help="start no section after this many seconds")
    parser.add_argument("--acceptance", default=str(ACCEPTANCE), help="the CPU run whose acceptance to model with")
    args = parser.parse_args(argv)
    import torch

    from specdec.device import describe, resolve_device

    device = str(resolve_device(args.device))  # one line and exit 2 from the CLI; here: a plain error
    sizes = gpu_checks.TINY if args.tiny else gpu_checks.Sizes()
    head_sizes = gpu_heads.TINY_HEADS if args.tiny else gpu_heads.HeadSizes()
    began = time.perf_counter()
    result: dict = {"device": describe(torch.device(device)), "machine": machine_info(), "versions": versions(ROOT),
                    "tiny": args.tiny, "sections": {}, "skipped": {}}

    def section(name: str, run) -> None:
        if name in args.skip:
            result["skipped"][name] = "--skip"
            return
        spent = time.perf_counter() - began
        if spent > args.budget_s:
            result["skipped"][name] = f"budget: {spent:.0f} s spent of {args.budget_s:.0f}"
            return
        start = time.perf_counter()
        try:
            result["sections"][name] = run()
        except Exception as exc:  # noqa: BLE001 - reported (and failing the check), the other sections still run
            import traceback

            traceback.print_exc()
            result.setdefault("errors", {})[name] = f"{type(exc).__name__}: {exc}"
        result.setdefault("seconds", {})[name] = round(time.perf_counter() - start, 1)
        print(f"gpu_check: {name} done in {result['seconds'][name]} s", file=sys.stderr, flush=True)

    with tempfile.TemporaryDirectory(prefix="gpu-check-") as tmp:
        models = gpu_checks.build_models(Path(tmp), sizes)
        section("equality", lambda: [row for graphs in (False, True)
                                     for row in gpu_checks.equality_in_process(models, device, graphs, sizes)])
        section("heads", lambda: [row for graphs in (False, True)
                                  for row in gpu_heads.equality_heads(Path(tmp), device, graphs, head_sizes)])
        section("grpc", lambda: [row for graphs in (False, True)
                                 for row in gpu_checks.equality_grpc(models, device, graphs, sizes)])
        section("gtest", lambda: gpu_checks.g_test(models, device, sizes))
    section("cost", lambda: gpu_cost.cost_curve(device, sizes))
    section("cost_sdpa", lambda: gpu_cost.cost_curve(device, sizes, attention="sdpa"))
    section("profile", lambda: gpu_cost.profile(device, sizes))
    section("decode", lambda: gpu_cost.decode(device, sizes))
    if "cost" in result["sections"]:
        section("speedup", lambda: speedups(result["sections"]["cost"], Path(args.acceptance)))
    result["total_seconds"] = round(time.perf_counter() - began, 1)
    checks = [*result["sections"].get("equality", []), *result["sections"].get("heads", []),
              *result["sections"].get("grpc", [])]
    result["ok"] = (all(r["identical"] and r.get("batched_identical", True) for r in checks)
                    and result["sections"].get("gtest", {}).get("passed", True) and not result.get("errors"))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "gpu_check.json").write_text(json.dumps(result, indent=1))
    (out / "gpu_check.md").write_text(markdown(result))
    print(markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
