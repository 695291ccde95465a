"""The Spec-Bench question loader: first turns, the six reported categories, per-category limits."""
from __future__ import annotations

import pytest

from specdec.bench.main import DEFAULT_QUESTIONS, resolve_questions_path
from specdec.bench.questions import CATEGORIES, load_questions, read_questions
from specdec.errors import InvalidArgument


def test_first_turn_and_mt_bench_grouping(question_file):
    questions = read_questions(question_file)
    assert [q.question_id for q in questions] == list(range(1, 9))
    first = questions[0]
    assert first.prompt == "Write a poem about the sea."  # the first turn only
    assert (first.category, first.subcategory) == ("mt_bench", "writing")
    assert {q.category for q in questions} == {"mt_bench", "translation", "qa", "summarization"}


def test_per_category_limit_keeps_spec_bench_order_and_mixes_mt_bench(question_file):
    picked = load_questions(question_file, per_category=2)
    assert [q.category for q in picked] == ["mt_bench", "mt_bench", "translation", "translation",
                                           "summarization", "qa", "qa"]
    assert [q.subcategory for q in picked[:2]] == ["writing", "roleplay"]  # round-robin, not two writing prompts
    assert len(load_questions(question_file, per_category=None)) == 8


def test_category_filter_and_bad_options(question_file):
    assert [q.question_id for q in load_questions(question_file, 5, ("qa",))] == [6, 7]
    with pytest.raises(InvalidArgument, match="unknown categories"):
        load_questions(question_file, 1, ("poetry",))
    with pytest.raises(InvalidArgument, match=">= 1"):
        load_questions(question_file, 0)
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_questions(question_file.parent / "missing.jsonl", 1)


def test_malformed_line_names_the_line(tmp_path):
    path = tmp_path / "q.jsonl"
    path.write_text('{"question_id": 1, "category": "qa", "turns": ["ok"]}\n{"question_id": 2}\n')
    with pytest.raises(InvalidArgument, match=r"q.jsonl:2"):
        read_questions(path)


def test_the_vendored_spec_bench_file():
    path = resolve_questions_path(DEFAULT_QUESTIONS)
    assert path.is_file(), "the Spec-Bench questions ship with the repository"
    assert path.parent.name == "spec_bench" and (path.parent / "LICENSE").is_file()
    questions = read_questions(path)
    assert len(questions) == 480
    assert {q.category for q in questions} == set(CATEGORIES)
    picked = load_questions(path, 3)
    assert len(picked) == 3 * len(CATEGORIES)
    assert len({q.subcategory for q in picked if q.category == "mt_bench"}) == 3
