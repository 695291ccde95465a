"""The workload report as Markdown, and its two pictures: speedup against acceptance per workload
(the seed's figure: where a workload's points sit says what speculation can earn on it) and the
accepted-length histogram per workload and drafter."""
from __future__ import annotations

from pathlib import Path

from specdec.bench.methods import BASELINE, depth_text
from specdec.bench.plots import _pyplot


def _num(value, fmt: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{fmt}}{suffix}"


def _drafters(report: dict) -> list[str]:
    return [m["name"] for m in report["methods"] if m["name"] != BASELINE]


def render_markdown(report: dict) -> str:
    machine, settings, results = report["machine"], report["settings"], report["results"]
    names = [m["name"] for m in report["methods"]]
    workloads = settings["workloads"]
    lines = ["# Acceptance per workload", "",
             f"Machine: {machine['cpu']}, {machine['num_cpus']} CPUs ({', '.join(machine['cpu_flags']) or 'no AVX'}), "
             f"load average {machine.get('load_average_1m', '?')} at the start; torch {report['versions']['torch']}.",
             f"Target: {settings['target']} ({settings['dtype']}). Prompts: {settings['num_prompts']} "
             f"({settings['per_workload'] or 'all'} per workload, chat template), at most {settings['max_new_tokens']} "
             f"new tokens, up to {depth_text(settings['num_speculative_tokens'])} draft tokens per step"
             f"{', adaptive depth' if settings['adaptive'] else ', fixed depth'}.",
             f"Command: `{report['command']}`", "",
             f"Lossless check (greedy workloads): {report['total_mismatches']} mismatching generations.", "",
             "## tau (tokens per target forward)", "",
             "| method | " + " | ".join(workloads) + " | overall |", "| --- |" + " ---: |" * (len(workloads) + 1)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(_num(results[w].get(name, {}).get("tau")) for w in [*workloads, "overall"])
                     + " |")
    lines += ["", "## Per workload", ""]
    for workload in workloads:
        temperature = settings["temperatures"].get(workload, 0.0)
        lines += [f"### {workload} ({'greedy' if temperature == 0 else f'sampling, temperature {temperature:g}'})", "",
                  "| method | tokens/s | speedup | tau | acceptance | steps drafted | accepted per drafted step: "
                  "0 / 1 / 2 / ... | mismatches |",
                  "| --- | ---: | ---: | ---: | ---: | ---: | --- | ---: |"]
        for name in names:
            m = results[workload].get(name)
            if m is None:
                continue
            hist = m["accepted_length_histogram"]
            steps = sum(hist) or 1
            shares = " / ".join(f"{100 * h / steps:.0f}" for h in hist[:max(2, _last_nonzero(hist) + 1)])
            lines.append(f"| {name} | {m['tokens_per_s']:.1f} | {_num(m['speedup'], '.2f', 'x')} | {m['tau']:.2f} | "
                         f"{m['acceptance_rate']:.2f} | {100 * m['drafted_step_share']:.0f}% | "
                         f"{shares + ' %' if name != BASELINE else '–'} | "
                         f"{_num(m['mismatches'], 'd')} |")
        lines.append("")
    lines += ["## Goals", ""]
    for g in report["goals"]:
        lines.append(f"- {g['workload']}: {g['method'] or 'best drafter'} tau >= {g['tau_goal']}: "
                     f"{_num(g['tau'])}, {'met' if g['met'] else 'not met'}")
    lines += ["", "Speedup: tokens/s (prefill included) over plain decoding's on the same prompts in the same run. "
              "acceptance: accepted / drafted tokens. steps drafted: verify steps that carried a draft (the adaptive "
              "controller drafts only where it expects a gain; other steps are plain). The histogram counts the "
              "drafted steps by the number of draft tokens accepted (the bonus token not included).", ""]
    return "\n".join(lines)


def _last_nonzero(values: list[int]) -> int:
    return max((i for i, v in enumerate(values) if v), default=0)


def plot_speedup_vs_acceptance(report: dict, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(8, 5.5))
    workloads, drafters = report["settings"]["workloads"], _drafters(report)
    markers = "os^Dvp*hX"
    for j, workload in enumerate(workloads):
        for i, name in enumerate(drafters):
            m = report["results"][workload].get(name)
            if m is None or m["speedup"] is None:
                continue
            ax.scatter([m["acceptance_rate"]], [m["speedup"]], color=f"C{j % 10}", marker=markers[i % len(markers)],
                       s=70, edgecolor="black", linewidths=0.5)
    for j, workload in enumerate(workloads):  # legends: colour = workload, marker = drafter
        ax.scatter([], [], color=f"C{j % 10}", marker="s", label=workload)
    for i, name in enumerate(drafters):
        ax.scatter([], [], color="white", edgecolor="black", marker=markers[i % len(markers)], label=name)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(0, max([1.5] + [m["speedup"] or 0 for r in report["results"].values() for m in r.values()]) * 1.15)
    ax.set_xlabel("acceptance rate (accepted / drafted tokens)")
    ax.set_ylabel(f"speedup over {BASELINE} decoding")
    ax.set_title("Speedup against acceptance, per workload (colour) and drafter (marker)")
    ax.legend(fontsize=8, ncols=2, loc="upper left")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_accepted_histograms(report: dict, path: Path) -> Path:
    plt = _pyplot()
    workloads, drafters = report["settings"]["workloads"], _drafters(report)
    cols = min(3, len(workloads))
    rows = (len(workloads) + cols - 1) // cols
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True)
    width = 0.8 / max(len(drafters), 1)
    for k, workload in enumerate(workloads):
        ax = axes[k // cols][k % cols]
        for i, name in enumerate(drafters):
            m = report["results"][workload].get(name)
            if m is None:
                continue
            hist = m["accepted_length_histogram"]
            steps = sum(hist) or 1
            xs = [n + (i - (len(drafters) - 1) / 2) * width for n in range(len(hist))]
            ax.bar(xs, [h / steps for h in hist], width, color=f"C{i % 10}",
                   label=f"{name} ({100 * m['drafted_step_share']:.0f}% of steps drafted)")
        ax.set_title(workload)
        ax.set_xlabel("draft tokens accepted per step")
        ax.grid(axis="y", alpha=0.3)
    for k in range(len(workloads), rows * cols):
        axes[k // cols][k % cols].axis("off")
    for r in range(rows):
        axes[r][0].set_ylabel("share of drafted steps")
    for k in range(len(workloads)):
        axes[k // cols][k % cols].legend(fontsize=7)
    fig.suptitle("Accepted draft tokens per drafted verify step")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_plots(report: dict, out_dir: Path) -> list[Path]:
    return [plot_speedup_vs_acceptance(report, out_dir / "speedup_vs_acceptance_workloads.png"),
            plot_accepted_histograms(report, out_dir / "accepted_length_histogram.png")]
