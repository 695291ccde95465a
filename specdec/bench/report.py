"""Per method per category figures, the goals, and the report as JSON and Markdown.

Rates are pooled, tokens / seconds over all questions of a category, rather than a mean of
per-question rates: a question that stops after five tokens behind a long prefill would otherwise
weigh as much as one that generated the full budget. Speedup is a method's pooled rate over the
baseline's on the same questions in the same run.
"""
from __future__ import annotations

from collections import defaultdict

from specdec.bench.methods import BASELINE, MethodSpec, depth_text
from specdec.bench.runner import Sample

SCHEMA = "specdec.bench/1"
OVERALL = "overall"
# The best method's speedup over plain decoding (greedy, overall) that the issues set, each reported met or
# not: 1.5x once the verify forward is cheap on CPUs (the forward-cost issue), 2.5x (the first Spec-Bench issue's
# aim on this CPU, never met here: the one-row forward is already near its bandwidth floor and a 2-thread CPU's
# verify rows are not free). The first is `best_speedup_goal`.
GOALS_BEST_SPEEDUP = (1.5, 2.5)
GOAL_VS_PEER = 1.3


def _metrics(samples: list[Sample]) -> dict:
    tokens = sum(s.num_new_tokens for s in samples)
    elapsed = sum(s.elapsed_s for s in samples)
    forwards = sum(s.num_target_forwards for s in samples)
    drafted = sum(s.num_draft_tokens for s in samples)
    split = {key: (sum(getattr(s, key) for s in samples) if all(getattr(s, key) is not None for s in samples)
                   else None) for key in ("draft_s", "verify_s", "prefill_s")}
    checked = [s for s in samples if s.mismatch is not None]
    return {"num_questions": len(samples), "num_new_tokens": tokens, "elapsed_s": elapsed,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0,
            "tau": tokens / forwards if forwards else 0.0,
            "acceptance_rate": sum(s.num_accepted_tokens for s in samples) / drafted if drafted else 0.0,
            "num_draft_tokens": drafted, **split,
            "draft_share": split["draft_s"] / elapsed if split["draft_s"] is not None and elapsed else None,
            "verify_share": split["verify_s"] / elapsed if split["verify_s"] is not None and elapsed else None,
            "mismatches": sum(s.mismatch for s in checked) if checked else None}


def _rate(s: Sample) -> float:
    return s.num_new_tokens / s.elapsed_s if s.elapsed_s > 0 else 0.0


def aggregate(samples: list[Sample], specs: tuple[MethodSpec, ...], categories: list[str]) -> dict:
    """{method: {category | 'overall': metrics}} with speedup over the baseline and over the peer."""
    groups: dict[tuple[str, str], list[Sample]] = defaultdict(list)
    for s in samples:
        groups[(s.method, s.category)].append(s)
        groups[(s.method, OVERALL)].append(s)
    keys = [c for c in categories if (BASELINE, c) in groups] + [OVERALL]
    results = {spec.name: {key: _metrics(groups[(spec.name, key)]) for key in keys if groups[(spec.name, key)]}
               for spec in specs}
    base_rates = {s.question_id: _rate(s) for s in groups[(BASELINE, OVERALL)]}
    for spec in specs:
        for key, m in results[spec.name].items():
            ratios = sorted(_rate(s) / base_rates[s.question_id] for s in groups[(spec.name, key)]
                            if base_rates.get(s.question_id))
            m["speedup_per_question"] = ({"min": ratios[0], "median": ratios[len(ratios) // 2], "max": ratios[-1]}
                                         if ratios else None)  # the spread: how much one run's noise moves it
            base = results[BASELINE].get(key, {}).get("tokens_per_s", 0.0)
            m["speedup"] = m["tokens_per_s"] / base if base else None
            peer = results.get(spec.peer, {}).get(key) if spec.peer else None
            m["speedup_vs_peer"] = m["tokens_per_s"] / peer["tokens_per_s"] if peer and peer["tokens_per_s"] else None
    return results


def mismatch_counts(samples: list[Sample]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for s in samples:
        if s.mismatch is not None:
            counts[s.method] = counts.get(s.method, 0) + int(s.mismatch)
    return counts


def goals(results: dict, specs: tuple[MethodSpec, ...]) -> dict:
    """The issue's goals against the greedy overall figures, reported as met or not, never hidden."""
    overall = {name: r[OVERALL] for name, r in results.items() if OVERALL in r}
    ours = {s.name for s in specs if s.family == "specdec" and s.name != BASELINE}
    candidates = {n: m["speedup"] for n, m in overall.items() if n in ours and m["speedup"] is not None}
    best = max(candidates, key=candidates.get) if candidates else None
    vs_peer = {s.name: {"peer": s.peer, "ratio": overall[s.name]["speedup_vs_peer"],
                        "met": (overall[s.name]["speedup_vs_peer"] or 0.0) >= GOAL_VS_PEER}
               for s in specs if s.family == "specdec" and s.peer and s.name in overall
               and overall[s.name]["speedup_vs_peer"] is not None}
    met = [{"goal": goal, "met": bool(best) and candidates[best] >= goal} for goal in GOALS_BEST_SPEEDUP]
    return {"best_method": best, "best_speedup": candidates.get(best) if best else None,
            "best_speedup_goal": met[0]["goal"], "best_speedup_met": met[0]["met"], "best_speedup_goals": met,
            "vs_peer_goal": GOAL_VS_PEER, "vs_peer": vs_peer}


def _num(value, fmt: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _split(m: dict) -> str:
    if m["draft_s"] is None:
        return "–"
    return f"{m['draft_s']:.1f} / {m['verify_s']:.1f} / {m['prefill_s']:.1f}"


def goal_lines(g: dict) -> list[str]:
    """One bullet per goal of goals(): each best-speedup threshold, then each method against its peer."""
    best = g.get("best_speedup_goals") or [{"goal": g["best_speedup_goal"], "met": g["best_speedup_met"]}]
    lines = [f"- best of the project's methods at least {goal['goal']}x the baseline: {g['best_method']} at "
             f"{_num(g['best_speedup'], '.2f', 'x')}, {'met' if goal['met'] else 'not met'}" for goal in best]
    return lines + [f"- {name} at least {g['vs_peer_goal']}x {v['peer']}: {v['ratio']:.2f}x, "
                    f"{'met' if v['met'] else 'not met'}" for name, v in g["vs_peer"].items()]


def render_markdown(report: dict) -> str:
    machine, settings = report["machine"], report["settings"]
    lines = ["# Spec-Bench results", "",
             f"Machine: {machine['cpu']}, {machine['num_cpus']} CPUs ({', '.join(machine['cpu_flags']) or 'no AVX'}), "
             f"{machine.get('accelerator') or 'no accelerator'}, torch {report['versions']['torch']} "
             f"({machine['torch_num_threads']} threads), transformers {report['versions']['transformers']}; "
             f"load average {machine.get('load_average_1m', '?')} at the start.",
             f"Target: {settings['target']} ({settings['dtype']}); draft model: {settings['draft_model'] or 'none'}.",
             f"Questions: {settings['num_questions']} ({settings['questions_per_category'] or 'all'} per category), "
             f"first turn, chat template; max {settings['max_new_tokens']} new tokens; "
             f"up to {depth_text(settings['num_speculative_tokens'])} draft tokens per step.",
             f"Command: `{report['command']}`", ""]
    for run in report["runs"]:
        results, mode = run["results"], run["mode"]
        header = (f"## {mode} (temperature {run['temperature']:g}, top-p {run['top_p']:g})" if mode == "sampling"
                  else "## greedy (temperature 0)")
        check = (f"Lossless check: {run['total_mismatches']} mismatching generations out of "
                 f"{run['num_checked']} (every method's token ids against the baseline's)."
                 if run["lossless_checked"] else "No equality check under sampling (outputs are random).")
        lines += [header, "", check, "",
                  "| method | tokens/s | speedup | per question (min-max) | tau | acceptance | "
                  "draft / verify / prefill s | vs peer | mismatches |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for spec in report["methods"]:
            m = results[spec["name"]][OVERALL]
            peer = f"{_num(m['speedup_vs_peer'], '.2f', 'x')} ({spec['peer']})" if m["speedup_vs_peer"] else "–"
            spread = m.get("speedup_per_question")
            spread = f"{spread['min']:.2f}-{spread['max']:.2f}" if spread else "–"
            lines.append(f"| {spec['name']} | {m['tokens_per_s']:.1f} | {_num(m['speedup'], '.2f', 'x')} | {spread} | "
                         f"{m['tau']:.2f} | {m['acceptance_rate']:.2f} | {_split(m)} | {peer} | "
                         f"{_num(m['mismatches'], 'd')} |")
        categories = [k for k in results[report["methods"][0]["name"]] if k != OVERALL] + [OVERALL]
        lines += ["", f"Speedup per category ({mode}):", "",
                  "| method | " + " | ".join(categories) + " |", "| --- |" + " ---: |" * len(categories)]
        for spec in report["methods"]:
            row = results[spec["name"]]
            lines.append(f"| {spec['name']} | " + " | ".join(
                _num(row.get(c, {}).get("speedup"), ".2f", "x") for c in categories) + " |")
        lines.append("")
    lines += ["Methods:", ""] + [f"- `{m['name']}`: {m['description']}" + (f"; compared with `{m['peer']}`"
                                                                           if m["peer"] else "")
                                  for m in report["methods"]] + [""]
    if report.get("goals"):
        lines += ["## Goals (greedy, overall)", "", *goal_lines(report["goals"]), ""]
    lines += ["tau: tokens emitted per target forward. acceptance: accepted / drafted tokens. "
              "Rates pool tokens and seconds over the questions (prefill included); speedups are ratios to "
              "`plain` measured in the same run. transformers peers cannot split their time (–); their "
              "forwards and draft tokens are counted with a forward hook on the target.", ""]
    return "\n".join(lines)
