"""The two pictures a reader looks for: speedup against acceptance rate, and speedup per category.

The first shows why a method is fast or slow (a drafter that is rarely right cannot win, a right
one that is expensive may still lose); the dashed curve is the chain bound tau(a, k) =
(1 - a^(k+1)) / (1 - a), the speedup free drafts and a verify as cheap as a plain step would give.
"""
from __future__ import annotations

from pathlib import Path

from specdec.bench.methods import BASELINE
from specdec.engine import DEFAULT_DEPTH
from specdec.bench.report import OVERALL


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")  # files only, never a window
    import matplotlib.pyplot as plt

    return plt


def plot_speedup_vs_acceptance(run: dict, methods: list[dict], num_speculative_tokens: int | None, path: Path) -> Path:
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7.5, 5))
    k = num_speculative_tokens or DEFAULT_DEPTH
    xs = [i / 100 for i in range(100)]
    ax.plot(xs, [(1 - a ** (k + 1)) / (1 - a) for a in xs], "--", color="grey", linewidth=1,
            label=f"bound (1-a^{k + 1})/(1-a)")
    ax.axhline(1.0, color="black", linewidth=0.8)
    markers = "os^Dvp*hX<>"
    for i, spec in enumerate(m for m in methods if m["name"] != BASELINE):
        by_category = run["results"][spec["name"]]
        color = f"C{i % 10}"
        cats = [c for c in by_category if c != OVERALL]
        ax.scatter([by_category[c]["acceptance_rate"] for c in cats], [by_category[c]["speedup"] or 0 for c in cats],
                   color=color, marker=markers[i % len(markers)], s=18, alpha=0.45)
        overall = by_category[OVERALL]
        peer = spec["family"] == "transformers"  # peers hollow, the project's methods filled
        ax.scatter([overall["acceptance_rate"]], [overall["speedup"] or 0], marker=markers[i % len(markers)], s=90,
                   facecolor="none" if peer else color, edgecolor=color if peer else "black",
                   linewidths=2 if peer else 1, label=spec["name"])
    top = max([m["speedup"] or 0 for r in run["results"].values() for m in r.values()] + [1.5])
    ax.set_ylim(0, top * 1.15)
    ax.set_xlim(-0.02, 1.0)
    ax.set_xlabel("acceptance rate (accepted / drafted tokens)")
    ax.set_ylabel(f"speedup over {BASELINE}")
    ax.set_title(f"Speedup vs acceptance ({run['mode']}); small: per category, large: overall")
    ax.legend(fontsize=8, loc="lower right")  # the points crowd low acceptance, the bound the upper right
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def plot_speedup_per_category(run: dict, methods: list[dict], path: Path) -> Path:
    plt = _pyplot()
    names = [m["name"] for m in methods if m["name"] != BASELINE]
    peers = {m["name"] for m in methods if m["family"] == "transformers"}
    categories = [c for c in run["results"][BASELINE] if c != OVERALL] + [OVERALL]
    fig, ax = plt.subplots(figsize=(max(7.5, 1.3 * len(categories) + 2), 5))
    width = 0.8 / max(len(names), 1)
    for i, name in enumerate(names):
        row = run["results"][name]
        xs = [j + (i - (len(names) - 1) / 2) * width for j in range(len(categories))]
        ax.bar(xs, [row.get(c, {}).get("speedup") or 0 for c in categories], width, label=name, color=f"C{i % 10}",
               hatch="//" if name in peers else None, edgecolor="white" if name in peers else None)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_xticks(range(len(categories)))
    ax.set_xticklabels(categories, rotation=20)
    ax.set_ylabel(f"speedup over {BASELINE}")
    ax.set_title(f"Speedup per Spec-Bench category ({run['mode']}); hatched: transformers peers")
    ax.legend(fontsize=8, ncols=2)
    ax.grid(axis="y", alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def write_plots(report: dict, out_dir: Path) -> list[Path]:
    paths = []
    for run in report["runs"]:
        mode = run["mode"]
        paths.append(plot_speedup_vs_acceptance(run, report["methods"], report["settings"]["num_speculative_tokens"],
                                                out_dir / f"speedup_vs_acceptance_{mode}.png"))
        paths.append(plot_speedup_per_category(run, report["methods"], out_dir / f"speedup_per_category_{mode}.png"))
    return paths
