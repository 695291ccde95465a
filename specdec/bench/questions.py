"""Spec-Bench questions: the first user turn of each, grouped as the Spec-Bench paper reports them.

Spec-Bench folds MT-Bench's eight categories (writing, roleplay, ...) into one "Multi-turn
Conversation" column; we keep that grouping (category `mt_bench`) so our per-category figures line
up with the published leaderboard, and keep the original category as `subcategory`. Only the first
turn is used: later turns need the model's own earlier answer, which would differ per method under
sampling and make prompts incomparable.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path

from specdec.errors import InvalidArgument

# The vendored question file (with its license and source in benchmarks/spec_bench/), relative to the repo root.
DEFAULT_QUESTIONS = "benchmarks/spec_bench/question.jsonl"
MT_BENCH_SUBCATEGORIES = ("writing", "roleplay", "reasoning", "math", "coding", "extraction", "stem", "humanities")
CATEGORIES = ("mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag")  # Spec-Bench's order


@dataclass(frozen=True)
class Question:
    question_id: int
    category: str  # one of CATEGORIES
    subcategory: str  # the file's own category (differs from `category` only for MT-Bench)
    prompt: str  # the first user turn; the chat template is applied when it is encoded


def spec_bench_category(raw_category: str) -> str:
    return "mt_bench" if raw_category in MT_BENCH_SUBCATEGORIES else raw_category


def read_questions(path: str | Path) -> list[Question]:
    path = Path(path)
    if not path.is_file():
        raise InvalidArgument(f"question file {str(path)!r} does not exist")
    questions = []
    for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
            turns = raw["turns"]
            questions.append(Question(int(raw["question_id"]), spec_bench_category(raw["category"]),
                                      raw["category"], str(turns[0])))
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise InvalidArgument(f"{path}:{line_no}: not a Spec-Bench question ({exc})") from exc
    return questions


def select_questions(questions: list[Question], per_category: int | None,
                     categories: tuple[str, ...] | None = None) -> list[Question]:
    """The first `per_category` questions of each category (None = all), categories in Spec-Bench order.

    Within mt_bench the pick goes round-robin over its subcategories, so two questions are a
    writing and a roleplay prompt rather than two writing prompts.
    """
    if per_category is not None and per_category < 1:
        raise InvalidArgument(f"questions per category must be >= 1, got {per_category}")
    present = [c for c in CATEGORIES if any(q.category == c for q in questions)]
    present += sorted({q.category for q in questions} - set(present))
    if categories:
        unknown = set(categories) - set(present)
        if unknown:
            raise InvalidArgument(f"unknown categories {', '.join(sorted(unknown))}; the file has {', '.join(present)}")
        present = [c for c in present if c in categories]
    selected = []
    for category in present:
        members = [q for q in questions if q.category == category]
        by_sub: dict[str, list[Question]] = {}
        for q in members:
            by_sub.setdefault(q.subcategory, []).append(q)
        interleaved = [q for group in zip_longest(*by_sub.values()) for q in group if q is not None]
        selected.extend(interleaved[:per_category] if per_category is not None else interleaved)
    return selected


def load_questions(path: str | Path, per_category: int | None, categories: tuple[str, ...] | None = None
                   ) -> list[Question]:
    return select_questions(read_questions(path), per_category, categories)
