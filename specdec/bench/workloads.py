"""The project's own workload prompts (benchmarks/workloads/, never Spec-Bench): one JSONL file per
workload, one chat (a list of messages) per line.

Acceptance depends on the workload far more than on the drafter: code edits, JSON and agent loops
that resend earlier output repeat what is already in the context, creative writing at temperature
1.0 does not. These files let a run show that per workload.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from specdec.errors import InvalidArgument

DEFAULT_DIR = "benchmarks/workloads"  # relative to the repo root
ORDER = ("code", "json", "rag", "agent", "summarization", "creative")  # the report's order; others follow by name
ROLES = ("system", "user", "assistant")


@dataclass(frozen=True)
class WorkloadPrompt:
    workload: str  # the file's stem
    prompt_id: str
    messages: tuple[tuple[str, str], ...]  # (role, content); the chat template is applied when encoded
    temperature: float = 0.0  # 0 = greedy (the lossless check applies); > 0 samples with a seed per prompt

    def chat(self) -> list[dict]:
        return [{"role": role, "content": content} for role, content in self.messages]


def read_workload(path: Path) -> list[WorkloadPrompt]:
    prompts = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            messages = tuple((m["role"], m["content"]) for m in raw["messages"])
            temperature = float(raw.get("temperature", 0.0))
            prompt = WorkloadPrompt(path.stem, str(raw["id"]), messages, temperature)
        except (ValueError, KeyError, TypeError) as exc:
            raise InvalidArgument(f"{path}:{line_no}: not a workload prompt ({exc})") from exc
        if not messages or any(role not in ROLES or not isinstance(text, str) for role, text in messages):
            raise InvalidArgument(f"{path}:{line_no}: messages need roles {', '.join(ROLES)} and text")
        if messages[-1][0] != "user" or temperature < 0:
            raise InvalidArgument(f"{path}:{line_no}: the last message must be the user's and temperature >= 0")
        prompts.append(prompt)
    return prompts


def load_workloads(directory: str | Path, names: tuple[str, ...] | None = None,
                   per_workload: int | None = None) -> list[WorkloadPrompt]:
    """The first `per_workload` prompts (None = all) of each named workload (None = every file), in ORDER."""
    directory = Path(directory)
    if not directory.is_dir():
        raise InvalidArgument(f"workload directory {str(directory)!r} does not exist")
    if per_workload is not None and per_workload < 1:
        raise InvalidArgument(f"prompts per workload must be >= 1, got {per_workload}")
    found = {p.stem: p for p in directory.glob("*.jsonl")}
    if names:
        unknown = sorted(set(names) - set(found))
        if unknown:
            raise InvalidArgument(f"unknown workloads {', '.join(unknown)}; {directory} has {', '.join(sorted(found))}")
    chosen = [n for n in ORDER if n in found] + sorted(set(found) - set(ORDER))
    chosen = [n for n in chosen if not names or n in names]
    prompts = []
    for name in chosen:
        prompts += read_workload(found[name])[:per_workload]
    if not prompts:
        raise InvalidArgument(f"no workload prompts found in {directory}")
    return prompts
