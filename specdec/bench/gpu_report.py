"""The GPU check's Markdown: the tables the README carries (benchmarks/gpu_check.py writes the JSON)."""
from __future__ import annotations


def markdown(result: dict) -> str:
    machine, versions = result["machine"], result["versions"]
    lines = [f"GPU check on {result['device']} ({machine.get('cpu')}, torch {versions.get('torch')}, "
             f"transformers {versions.get('transformers')}, commit {versions.get('git_commit')}"
             f"{', tiny sizes' if result.get('tiny') else ''}): {result.get('total_seconds')} s, "
             f"{'all exactness checks passed' if result.get('ok') else 'A CHECK FAILED'}.", ""]
    sections, skipped = result["sections"], result.get("skipped", {})
    checks = [*sections.get("equality", []), *sections.get("heads", []), *sections.get("grpc", [])]
    if checks:
        lines += ["| path | drafter | CUDA graphs | graphs ran | identical to plain | batched identical | accepted / drafted |",
                  "|---|---|---|---|---|---|---|"]
        for r in checks:
            ran = "yes" if r.get("graphs_active") else ("-" if "graphs_active" not in r else
                                                        f"no ({r.get('graphs_off_reason') or 'off'})")
            lines.append(f"| {r['path']} | {r['drafter']} | {'on' if r['cuda_graphs'] else 'off'} | {ran} | "
                         f"{_yes(r['identical'])} | {_yes(r['batched_identical']) if 'batched_identical' in r else '-'} | "
                         f"{r['accepted']} / {r['drafted']} |")
        lines.append("")
        for r in sections.get("grpc", [])[:1]:
            lines += [f"Over gRPC the target worker reported device {r['target_device']} and a KV capacity of "
                      f"{r['kv_capacity_tokens']} tokens ({r['kv_capacity_source']}).", ""]
    if "gtest" in sections:
        g = sections["gtest"]
        lines += [f"G-test of sampled output (draft model, chains of 3, temperature 1, top-k 8): {g['draws']} draws over "
                  f"{g['outcomes']} outcomes, KL {g['kl']:.5f} against tolerance {g['tolerance']:.5f}: "
                  f"{'passed' if g['passed'] else 'FAILED'} ({g['accepted']} of {g['drafted']} drafted tokens accepted).", ""]
    if "cost" in sections:
        lines += _cost(sections["cost"])
    if "cost_sdpa" in sections:
        lines += ["The same with transformers' sdpa attention (keys and values repeated per query head when a "
                  "masked call has several rows), the baseline of specdec.kernels.grouped:", ""]
        lines += _cost(sections["cost_sdpa"])
    if "profile" in sections:
        lines += _profile(sections["profile"])
    if "decode" in sections:
        lines += _decode(sections["decode"], sections.get("cost"))
    if "speedup" in sections:
        lines += _speedup(sections["speedup"])
    for name, error in result.get("errors", {}).items():
        lines.append(f"Section {name} FAILED: {error}.")
    for name, why in skipped.items():
        lines.append(f"Section {name} skipped: {why}.")
    return "\n".join(lines).rstrip() + "\n"


def _yes(value: bool) -> str:
    return "yes" if value else "**NO**"


def _cost(cost: dict) -> list[str]:
    batches = sorted({r["batch"] for r in cost["rows"]})
    rows = sorted({r["rows"] for r in cost["rows"]})
    cell = {(r["batch"], r["rows"]): r for r in cost["rows"]}
    graphs = "" if cost["graphs_active"] else f" (graphs off: {cost['graphs_off_reason']})"
    out = [f"One verify forward of the {cost['model']} model ({cost['parameters'] / 1e9:.2f} B parameters, "
           f"{cost['dtype']}, {cost['cached_tokens']} cached tokens, LM head over every row, attention "
           f"{cost.get('attention', 'sdpa')}): ms eager / ms with "
           f"CUDA graphs, and in brackets the ratio to the one-row step of the same batch{graphs}.", "",
           "| rows \\ batch | " + " | ".join(map(str, batches)) + " |", "|---" * (len(batches) + 1) + "|"]
    for n in rows:
        cells = []
        for b in batches:
            r = cell.get((b, n))
            if r is None:
                cells.append("-")
                continue
            graphed = "-" if r["graphs_ms"] is None else f"{r['graphs_ms']:.2f} ({r['graphs_ratio']:.2f}x)"
            cells.append(f"{r['eager_ms']:.2f} ({r['eager_ratio']:.2f}x) / {graphed}")
        out.append(f"| {n} | " + " | ".join(cells) + " |")
    return out + [""]


def _profile(shapes: list[dict]) -> list[str]:
    out = ["Where a graphed forward's device time goes (torch.profiler, 5 forwards; microseconds per forward):", ""]
    for shape in shapes:
        kernels = "; ".join(f"{k['name'][:60]} {k['us_per_forward']:.0f}" for k in shape["kernels"][:5])
        out.append(f"- batch {shape['batch']}, {shape['rows']} rows: {shape['device_us_per_forward']:.0f} us on the "
                   f"device; top kernels: {kernels}")
    return out + [""]


def _decode(runs: list[dict], cost: dict | None) -> list[str]:
    one = {r["rows"]: r["graphs_ms"] or r["eager_ms"] for r in (cost or {}).get("rows", []) if r["batch"] == 1}
    out = ["End to end on the same model, one sequence (64 new tokens, 3 runs): ms per target forward, and the "
           "forward alone at the nearest measured row count (cost section):", "",
           "| drafter | graphs | graphs captured while timed | tok/s | tau | rows a forward | ms a forward | "
           "of which verify / draft | forward alone |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in runs:
        rows = min(one, key=lambda n: abs(n - r["rows_per_forward"])) if one else None
        alone = f"{one[rows]:.2f} ({rows} rows)" if rows else "-"
        out.append(f"| {r['drafter']} | {'on' if r['graphs'] else 'off'} | {r.get('captures_timed', '-')} | "
                   f"{r['tokens_per_s']} | {r['tau']} | "
                   f"{r['rows_per_forward']} | {r['ms_per_forward']:.2f} | {r['verify_ms_per_forward']:.2f} / "
                   f"{r['draft_ms_per_forward']:.2f} | {alone} |")
    return out + [""]


def _speedup(speed: dict) -> list[str]:
    out = [f"Modelled speedup per drafter (specdec/bench/speedup_model.py: S_k = E_k / T_k, E_k = 1 + s sum_i<=k "
           f"P(A >= i), T_k = (1 - s) + s (c(B, k+1) / c(B, 1) + k r), best k in 0..8) from the cost curve above "
           f"and acceptance measured on {speed['acceptance_machine']} with {speed['acceptance_target']} "
           f"({speed['acceptance_from']}):", "",
           "| drafter | batch | mode | speedup | depth k | drafted share s | P(A>=1..4) | draft cost r |",
           "|---|---|---|---|---|---|---|---|"]
    for r in speed["rows"]:
        out.append(f"| {r['drafter']} | {r['batch']} | {r['mode']} | {r['speedup']:.2f}x | {r['depth']} | "
                   f"{r['drafted_step_share']} | {', '.join(map(str, r['p_accept_ge']))} | {r['draft_cost_ratio']} |")
    return out + [""]
