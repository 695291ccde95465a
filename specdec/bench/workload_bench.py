"""`specdec bench --workloads`: the project's drafters on its own workload prompts, per workload.

Per workload and method: tokens/s, speedup over plain decoding in the same run, tau, acceptance
rate, the share of verify steps that carried a draft (the adaptive controller skips drafting where
it does not pay), and the histogram of accepted draft tokens per drafted step (from the engine's
stream: one event per step carries the step's tokens, accepted + 1; the last step of a generation
may be cut short by EOS or the token limit). Methods run interleaved per prompt in a rotating order, as in the
Spec-Bench runner; greedy workloads must reproduce plain decoding's tokens exactly (exit 1
otherwise), sampled ones (creative writing, temperature 1.0) use the same seed for every method.
Drafters that learn from earlier generations (suffix) start the run empty, after the warm-up.
"""
from __future__ import annotations

import json
import time
from collections import defaultdict
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from specdec.bench import methods as methods_mod
from specdec.bench.machine import machine_info, versions
from specdec.bench.workloads import DEFAULT_DIR, WorkloadPrompt, load_workloads
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument

DEFAULT_METHODS = ("plain", "ngram", "suffix", "draft", "medusa", "eagle", "eagle3", "hybrid")
GOALS = (("suffix", "agent", 3.0), ("suffix", "json", 3.0), (None, "code", 2.5))  # (method or best, workload, tau)


@dataclass(frozen=True)
class WorkloadBenchConfig:
    directory: str = DEFAULT_DIR
    workloads: tuple[str, ...] | None = None  # None = every workload file
    per_workload: int | None = 2  # prompts per workload (None = all)
    methods: tuple[str, ...] | None = None  # None = DEFAULT_METHODS that can run here
    max_new_tokens: int = 96
    top_p: float = 1.0  # sampled workloads
    seed: int = 0  # sampled workloads: prompt i uses seed + i for every method
    target: str | None = None
    checkpoints: tuple[tuple[str, str], ...] = ()
    dtype: str = "auto"
    num_speculative_tokens: int | None = None  # None: each drafter's own default depth
    adaptive: bool = True
    out_dir: str = "benchmarks/out/workloads"
    plots: bool = True
    progress: bool = True
    command: str = "specdec bench --workloads"


@dataclass(frozen=True)
class WorkloadSample:
    workload: str
    prompt_id: str
    method: str
    temperature: float
    prompt_len: int
    num_new_tokens: int
    elapsed_s: float
    num_target_forwards: int
    num_draft_tokens: int
    num_accepted_tokens: int
    accepted_lengths: list[int]  # per verify step that carried a draft: draft tokens accepted
    num_undrafted_steps: int  # verify steps without a draft (plain steps)
    mismatch: bool | None  # greedy: token ids differ from plain's; None when sampled


class _RecordingSession:
    """A drafter session that notes the size of each draft, keyed by the context length it continues."""

    def __init__(self, inner, sizes: dict[int, int]):
        self.inner, self.sizes = inner, sizes

    def propose(self, context_ids, *args, **kwargs):
        tree = self.inner.propose(context_ids, *args, **kwargs)
        self.sizes[len(context_ids)] = tree.num_nodes
        return tree

    def __getattr__(self, name):  # attach, needs_features, close, ...: the real session's
        return getattr(self.inner, name)


class _RecordingDrafter:
    def __init__(self, inner, sizes: dict[int, int]):
        self.inner, self.sizes = inner, sizes

    def new_session(self):
        return _RecordingSession(self.inner.new_session(), self.sizes)

    def __getattr__(self, name):
        return getattr(self.inner, name)


def generate_steps(engine, prompt_ids: list[int], params: SamplingParams):
    """(GenerationOutput, accepted draft tokens per drafted step, number of steps without a draft),
    from the engine's stream and the drafts its drafter returned."""
    sizes: dict[int, int] = {}
    drafter = engine.drafter
    engine.drafter = _RecordingDrafter(drafter, sizes) if drafter is not None else None
    try:
        lengths, undrafted, output, context_len = [], 0, None, len(prompt_ids)
        for event in engine.stream(list(prompt_ids), params):
            if sizes.get(context_len, 0) > 0:
                lengths.append(max(len(event.token_ids) - 1, 0))
            else:
                undrafted += 1
            context_len += len(event.token_ids)
            output = event.output or output
    finally:
        engine.drafter = drafter
    return output, lengths, undrafted


def _metrics(samples: list[WorkloadSample], max_depth: int) -> dict:
    tokens = sum(s.num_new_tokens for s in samples)
    elapsed = sum(s.elapsed_s for s in samples)
    forwards = sum(s.num_target_forwards for s in samples)
    drafted = sum(s.num_draft_tokens for s in samples)
    histogram = [0] * (max_depth + 1)
    for s in samples:
        for n in s.accepted_lengths:
            histogram[min(n, max_depth)] += 1
    drafted_steps = sum(histogram)
    checked = [s.mismatch for s in samples if s.mismatch is not None]
    return {"num_prompts": len(samples), "num_new_tokens": tokens, "elapsed_s": elapsed,
            "tokens_per_s": tokens / elapsed if elapsed > 0 else 0.0, "tau": tokens / forwards if forwards else 0.0,
            "acceptance_rate": sum(s.num_accepted_tokens for s in samples) / drafted if drafted else 0.0,
            "num_draft_tokens": drafted, "accepted_length_histogram": histogram,
            "drafted_step_share": drafted_steps / forwards if forwards else 0.0,
            "mismatches": sum(checked) if checked else None}


def aggregate(samples: list[WorkloadSample], method_names: list[str], workloads: list[str], max_depth: int) -> dict:
    """{workload: {method: metrics + speedup over plain}}, with 'overall' pooling every workload."""
    groups: dict[tuple[str, str], list[WorkloadSample]] = defaultdict(list)
    for s in samples:
        groups[(s.workload, s.method)].append(s)
        groups[("overall", s.method)].append(s)
    results = {}
    for workload in [*workloads, "overall"]:
        row = {m: _metrics(groups[(workload, m)], max_depth) for m in method_names if groups[(workload, m)]}
        base = row.get(methods_mod.BASELINE, {}).get("tokens_per_s", 0.0)
        for m in row.values():
            m["speedup"] = m["tokens_per_s"] / base if base else None
        results[workload] = row
    return results


def goals(results: dict) -> list[dict]:
    """The issue's acceptance goals per workload, each reported met or not."""
    out = []
    for method, workload, tau in GOALS:
        row = {m: r for m, r in results.get(workload, {}).items() if m != methods_mod.BASELINE}
        if method is None and row:
            method = max(row, key=lambda m: row[m]["tau"])
        got = row.get(method, {}).get("tau") if method else None
        out.append({"workload": workload, "method": method, "tau_goal": tau, "tau": got,
                    "met": got is not None and got >= tau})
    return out


def run_workload_bench(config: WorkloadBenchConfig) -> tuple[dict, int]:
    from specdec.bench.main import REPO_ROOT, resolve_questions_path
    from specdec.bench.workload_report import render_markdown, write_plots

    directory = resolve_questions_path(config.directory)
    prompts = load_workloads(directory, config.workloads, config.per_workload)
    specs = methods_mod.resolve_methods(config.methods or DEFAULT_METHODS)
    peers = [s.name for s in specs if s.family != "specdec"]
    if peers:
        raise InvalidArgument(f"workload runs compare the project's drafters; {', '.join(peers)} run only on Spec-Bench")
    settings = methods_mod.MethodSettings(config.num_speculative_tokens, config.adaptive, config.checkpoints)
    out_dir = Path(config.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)

    from transformers.utils import logging as hf_logging

    from specdec.engine import Engine
    from specdec.models.loader import load_model, pick_dtype

    hf_logging.set_verbosity_error()
    machine = machine_info()
    target = load_model(config.target, pick_dtype(config.dtype, target=config.target))
    skipped = {s.name: f"no trained {s.drafter} checkpoint for this target" for s in specs
               if not methods_mod.runnable(s, target, dict(config.checkpoints))}
    specs = tuple(s for s in specs if s.name not in skipped)
    checkpoints = methods_mod.resolve_checkpoints(specs, target, settings)
    runners = methods_mod.build_methods(specs, target, replace(settings, checkpoints=tuple(checkpoints.items())))
    encoder = Engine(target, None)
    encoded = [encoder.encode(p.chat(), chat=True) for p in prompts]
    for runner in runners:  # untimed warm-up, then drafters that learn from generations forget it
        runner.engine.generate(encoded[0], SamplingParams(max_new_tokens=8))
        runner.reset()

    samples: list[WorkloadSample] = []
    started = time.time()
    from tqdm import tqdm

    with tqdm(total=len(prompts) * len(runners), desc="workloads", unit="gen", disable=not config.progress) as bar:
        for index, (prompt, ids) in enumerate(zip(prompts, encoded)):
            samples += _run_prompt(config, index, prompt, ids, runners, bar)
    workloads = list(dict.fromkeys(p.workload for p in prompts))
    names = [s.name for s in specs]
    results = aggregate(samples, names, workloads, max(r.engine.num_speculative_tokens for r in runners))
    mismatches = sum(1 for s in samples if s.mismatch)
    report = {
        "schema": "specdec.bench.workloads/1", "created_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(started)),
        "duration_s": round(time.time() - started, 1), "command": config.command, "machine": machine,
        "versions": versions(REPO_ROOT),
        "settings": {**asdict(config), "directory": str(directory), "num_prompts": len(prompts),
                     "workloads": workloads, "target": str(target.path), "skipped_methods": skipped,
                     "checkpoints": checkpoints,
                     "dtype": str(next(target.model.parameters()).dtype).removeprefix("torch."),
                     "temperatures": {p.workload: p.temperature for p in prompts}},
        "methods": [s.to_dict() for s in specs], "results": results, "goals": goals(results),
        "total_mismatches": mismatches, "ok": mismatches == 0, "samples": [asdict(s) for s in samples],
    }
    (out_dir / "report.json").write_text(json.dumps(report, indent=1) + "\n")
    (out_dir / "report.md").write_text(render_markdown(report))
    if config.plots:
        write_plots(report, out_dir)
    return report, 0 if mismatches == 0 else 1


def _run_prompt(config: WorkloadBenchConfig, index: int, prompt: WorkloadPrompt, ids: list[int], runners,
                bar) -> list[WorkloadSample]:
    sampled = prompt.temperature > 0
    params = SamplingParams(temperature=prompt.temperature, top_p=config.top_p if sampled else 1.0,
                            seed=config.seed + index if sampled else None, max_new_tokens=config.max_new_tokens)
    shift = index % len(runners)
    runs = {}
    for runner in runners[shift:] + runners[:shift]:
        out, lengths, undrafted = generate_steps(runner.engine, ids, params)
        runs[runner.spec.name] = (out, lengths, undrafted)
        bar.set_postfix_str(f"{prompt.workload} {runner.spec.name} tau {out.stats.tau:.2f}")
        bar.update(1)
    baseline = runs[methods_mod.BASELINE][0].token_ids
    samples = []
    for runner in runners:
        out, lengths, undrafted = runs[runner.spec.name]
        s = out.stats
        samples.append(WorkloadSample(prompt.workload, prompt.prompt_id, runner.spec.name, prompt.temperature, len(ids),
                                      s.num_new_tokens, s.elapsed_s, s.num_target_forwards, s.num_draft_tokens,
                                      s.num_accepted_tokens, lengths, undrafted,
                                      None if sampled else out.token_ids != baseline))
    return samples
