"""From options to files: load once, run every mode, write report.json, report.md and the plots.

Questions and options are checked before any model is loaded, so a typo costs nothing. The exit
code is the lossless contract's verdict: 1 when any method's greedy output differs from the
baseline's, 0 otherwise; speed goals are reported, not enforced.
"""
from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specdec.bench import methods as methods_mod
from specdec.bench import plots
from specdec.bench.machine import machine_info, versions
from specdec.bench.questions import CATEGORIES, DEFAULT_QUESTIONS, load_questions
from specdec.bench.report import SCHEMA, aggregate, goals, mismatch_counts, render_markdown
from specdec.bench.runner import ModeConfig, Sample, run_mode, warm_up
from specdec.errors import InvalidArgument

REPO_ROOT = Path(__file__).resolve().parents[2]


# New tokens per answer. Spec-Bench's own scripts allow 1,024; at 64, prefill was a fifth of plain decoding's
# time on a 2-core CPU, so the run timed prompts more than decoding. 256 keeps a run within ~30 minutes here.
SPEC_BENCH_NEW_TOKENS = 256


@dataclass(frozen=True)
class BenchConfig:
    questions_path: str = DEFAULT_QUESTIONS
    questions_per_category: int | None = 1  # 6 questions: 16 min measured at load 4 on this 2-core CPU
    categories: tuple[str, ...] | None = None
    methods: tuple[str, ...] | None = None  # None = every available method
    modes: tuple[str, ...] = ("greedy", "sampling")
    max_new_tokens: int = SPEC_BENCH_NEW_TOKENS
    temperature: float = 0.7  # the sampling mode's
    top_p: float = 0.9
    seed: int = 0
    target: str | None = None  # None = the embedded SmolLM2-135M-Instruct
    checkpoints: tuple[tuple[str, str], ...] = ()  # (drafter, dir); unnamed: shipped for the target, else skipped
    dtype: str = "auto"
    num_speculative_tokens: int | None = None  # None: each drafter's own default depth
    adaptive: bool = True
    out_dir: str = "benchmarks/out"
    plots: bool = True
    progress: bool = True
    command: str = "specdec bench"

    def __post_init__(self) -> None:
        if not self.modes or len(set(self.modes)) != len(self.modes):
            raise InvalidArgument(f"modes must be distinct and non-empty, got {self.modes}")
        for mode in self.modes:
            self.mode_config(mode)
        if self.num_speculative_tokens is not None and not 1 <= self.num_speculative_tokens <= 64:  # EngineConfig's bound, checked before any model loads
            raise InvalidArgument(f"num_speculative_tokens must be in [1, 64], got {self.num_speculative_tokens}")

    def mode_config(self, mode: str) -> ModeConfig:
        if mode == "greedy":
            return ModeConfig("greedy", self.max_new_tokens)
        return ModeConfig(mode, self.max_new_tokens, self.temperature, self.top_p, self.seed)


def resolve_questions_path(path: str) -> Path:
    """A path as given if it exists (relative to the working directory), else relative to the repo root."""
    given = Path(path).expanduser()
    return given if given.is_absolute() or given.exists() else (REPO_ROOT / given).resolve()


def run_benchmark(config: BenchConfig) -> tuple[dict, int]:
    """Run, write the files under config.out_dir, and return (report, exit code)."""
    questions_path = resolve_questions_path(config.questions_path)
    questions = load_questions(questions_path, config.questions_per_category, config.categories)
    if not questions:
        raise InvalidArgument(f"no questions selected from {questions_path}")
    specs = methods_mod.resolve_methods(config.methods)
    settings = methods_mod.MethodSettings(config.num_speculative_tokens, config.adaptive, config.checkpoints)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    from transformers.utils import logging as hf_logging

    from specdec.drafters import checkpoint_name
    from specdec.engine import Engine
    from specdec.models.loader import load_model, pick_dtype

    hf_logging.set_verbosity_error()  # transformers' deprecation chatter would bury the progress bar
    machine = machine_info()  # load average before we add our own
    target = load_model(config.target, pick_dtype(config.dtype, target=config.target))
    checkpoints = dict(config.checkpoints)
    skipped = {s.name: f"no trained {checkpoint_name(s.drafter)} checkpoint for this target "
                       f"(pass --checkpoint {checkpoint_name(s.drafter)}=DIR)"
               for s in specs if not methods_mod.runnable(s, target, checkpoints)} if config.methods is None else {}
    specs = tuple(s for s in specs if s.name not in skipped)
    # Resolve every checkpoint once, up front: the report must name what ran, even if a shipped
    # checkpoint appears on disk while the benchmark is running.
    checkpoints = methods_mod.resolve_checkpoints(specs, target, settings)
    settings = replace(settings, checkpoints=tuple(checkpoints.items()))
    runners = methods_mod.build_methods(specs, target, settings)
    encoder = Engine(target, None)
    prompts = [encoder.encode(q.prompt, chat=True) for q in questions]
    warm_up(runners, prompts[0])

    samples: list[Sample] = []
    started = time.time()
    with _progress(len(config.modes) * len(questions) * len(runners), config.progress) as bar:
        for mode in config.modes:
            def on_sample(s: Sample, mode=mode) -> None:
                bar.set_postfix_str(f"{mode} {s.category} {s.method} {s.num_new_tokens / s.elapsed_s:.1f} tok/s")
                bar.update(1)

            samples += run_mode(config.mode_config(mode), questions, prompts, runners, on_sample)

    categories = [c for c in CATEGORIES if any(q.category == c for q in questions)]
    categories += sorted({q.category for q in questions} - set(categories))
    runs = [_run_report(config.mode_config(mode), [s for s in samples if s.mode == mode], specs, categories)
            for mode in config.modes]
    greedy = next((r for r in runs if r["mode"] == "greedy"), None)
    total_mismatches = sum(r["total_mismatches"] for r in runs)
    report = {
        "schema": SCHEMA, "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1), "command": config.command,
        "machine": machine, "versions": versions(REPO_ROOT),
        "settings": {**asdict(config), "questions_path": str(questions_path), "num_questions": len(questions),
                     "categories": categories, "target": str(target.path),
                     "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
                     "draft_model": _describe_draft(target, checkpoints.get("draft")), "skipped_methods": skipped,
                     "checkpoints": checkpoints},
        "methods": [s.to_dict() for s in specs],
        "runs": runs,
        "goals": goals(greedy["results"], specs) if greedy else None,
        "total_mismatches": total_mismatches, "ok": total_mismatches == 0,
    }
    write_report(report, out_dir, config.plots)
    return report, 0 if total_mismatches == 0 else 1


def write_report(report: dict, out_dir: Path, with_plots: bool = True) -> list[Path]:
    paths = [out_dir / "report.json", out_dir / "report.md"]
    paths[0].write_text(json.dumps(report, indent=1) + "\n")
    paths[1].write_text(render_markdown(report))
    if with_plots:
        paths += plots.write_plots(report, out_dir)
    return paths


def _run_report(mode: ModeConfig, samples: list[Sample], specs, categories: list[str]) -> dict:
    counts = mismatch_counts(samples)
    return {"mode": mode.name, "temperature": mode.temperature, "top_p": mode.top_p,
            "seed": None if mode.greedy else mode.seed, "lossless_checked": mode.greedy,
            "num_checked": sum(1 for s in samples if s.mismatch is not None),
            "mismatches": counts, "total_mismatches": sum(counts.values()),
            "results": aggregate(samples, specs, categories), "samples": [s.to_dict() for s in samples]}


def _describe_draft(target, path: str | None) -> str | None:
    from specdec.models.loader import random_draft_path

    if path is not None and path == str(random_draft_path(target)):
        return f"random stand-in (an untrained 1-layer Llama: acceptance near 0, measures overhead only) {path}"
    return path


def render_existing(out_dir: str | Path, with_plots: bool = True) -> tuple[dict, int]:
    """Recompute the figures, report.md and the plots from the samples in an existing report.json,
    running nothing: a change of presentation or of a derived figure should not cost another run."""
    out_dir = Path(out_dir)
    path = out_dir / "report.json"
    if not path.is_file():
        raise InvalidArgument(f"{path} does not exist: run the benchmark first")
    report = json.loads(path.read_text())
    by_name = {m.name: m for m in methods_mod.METHODS}
    specs = tuple(by_name[m["name"]] for m in report["methods"] if m["name"] in by_name)
    report["methods"] = [s.to_dict() for s in specs]
    for run in report["runs"]:  # derived figures follow the current code; the measurements stay as they were
        mode = ModeConfig(run["mode"], report["settings"]["max_new_tokens"], run["temperature"], run["top_p"],
                          run["seed"] or 0)
        run.update(_run_report(mode, [Sample(**s) for s in run["samples"]], specs, report["settings"]["categories"]))
    greedy = next((r for r in report["runs"] if r["mode"] == "greedy"), None)
    report["goals"] = goals(greedy["results"], specs) if greedy else None
    write_report(report, out_dir, with_plots)
    return report, 0 if report["total_mismatches"] == 0 else 1


def _progress(total: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(total=total, desc="bench", unit="gen", disable=not enabled, dynamic_ncols=True)
