"""`specdec bench` end to end on a tiny chat model: every method, both modes, the report's schema,
and the lossless check failing the command when a method is deliberately wrong."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from specdec.bench import methods as methods_mod
from specdec.bench.methods import METHODS, MethodResult
from specdec.cli import main

METRIC_KEYS = {"num_questions", "num_new_tokens", "elapsed_s", "tokens_per_s", "speedup", "speedup_vs_peer", "tau",
               "acceptance_rate", "num_draft_tokens", "draft_s", "verify_s", "prefill_s", "draft_share",
               "verify_share", "mismatches", "speedup_per_question"}


def bench(models, question_file, out, *extra):
    target, draft = models
    return main(["bench", "--target", target, "--draft", draft, "--questions", str(question_file),
                 "--questions-per-category", "1", "--max-new-tokens", "6", "--out", str(out), "--no-progress",
                 *extra])


def test_report_schema_all_methods_both_modes(chat_models, question_file, tmp_path):
    assert bench(chat_models, question_file, tmp_path) == 0
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["schema"] == "specdec.bench/1" and report["ok"] and report["total_mismatches"] == 0
    assert {"cpu", "num_cpus", "torch_num_threads"} <= set(report["machine"])
    assert {"python", "torch", "transformers", "git_commit"} <= set(report["versions"])
    assert report["settings"]["max_new_tokens"] == 6 and report["settings"]["num_questions"] == 4
    names = [m["name"] for m in report["methods"]]
    # every available method by default, plain first; self-drafting heads need a checkpoint the tiny target lacks
    heads = ("medusa", "eagle", "eagle3", "hybrid")
    assert names == [m.name for m in METHODS if m.available and m.drafter not in heads]
    assert set(report["settings"]["skipped_methods"]) == {"medusa", "eagle", "eagle3", "hybrid", "hybrid-choose"}
    assert report["settings"]["checkpoints"] == {"draft": chat_models[1]}
    assert [r["mode"] for r in report["runs"]] == ["greedy", "sampling"]
    greedy, sampling = report["runs"]
    assert greedy["lossless_checked"] and greedy["num_checked"] == 4 * len(names)
    assert not sampling["lossless_checked"] and sampling["temperature"] == 0.7 and sampling["top_p"] == 0.9
    for run in report["runs"]:
        assert set(run["results"]) == set(names)
        for per_category in run["results"].values():
            assert set(per_category) == {"mt_bench", "translation", "summarization", "qa", "overall"}
            assert all(METRIC_KEYS <= set(m) for m in per_category.values())
        assert run["results"]["plain"]["overall"]["speedup"] == 1.0
        assert len(run["samples"]) == 4 * len(names)
    assert greedy["results"]["ngram"]["overall"]["speedup_vs_peer"] is not None
    assert report["goals"]["best_method"] in names
    markdown = (tmp_path / "report.md").read_text()
    assert "| method | tokens/s | speedup |" in markdown and "## sampling" in markdown
    for name in ("speedup_vs_acceptance_greedy", "speedup_per_category_sampling"):
        assert (tmp_path / f"{name}.png").stat().st_size > 1000

    (tmp_path / "report.md").unlink()
    (tmp_path / "speedup_vs_acceptance_greedy.png").unlink()
    assert main(["bench", "--render-only", "--out", str(tmp_path)]) == 0  # presentation redone, nothing rerun
    assert (tmp_path / "report.md").read_text() == markdown
    assert (tmp_path / "speedup_vs_acceptance_greedy.png").is_file()


class WrongTokens:
    """A method that breaks the lossless contract: it changes the third token it emits."""

    def __init__(self, inner):
        self.spec = inner.spec
        self.inner = inner

    def generate(self, prompt_ids, params):
        result = self.inner.generate(prompt_ids, params)
        ids = list(result.token_ids)
        if len(ids) > 2:
            ids[2] = (ids[2] + 1) % 90 + 4
        return replace(result, token_ids=ids)


@pytest.fixture()
def broken_ngram(monkeypatch):
    build = methods_mod.build_methods

    def build_with_a_broken_ngram(specs, target, settings):
        return [WrongTokens(m) if m.spec.name == "ngram" else m for m in build(specs, target, settings)]

    monkeypatch.setattr(methods_mod, "build_methods", build_with_a_broken_ngram)


def test_a_wrong_method_fails_the_command(chat_models, question_file, tmp_path, broken_ngram, capsys):
    assert bench(chat_models, question_file, tmp_path, "--methods", "ngram", "--mode", "greedy", "--no-plots") == 1
    report = json.loads((tmp_path / "report.json").read_text())
    run = report["runs"][0]
    assert run["mismatches"] == {"plain": 0, "ngram": 4} and not report["ok"]
    assert all(s["first_mismatch_at"] == 2 for s in run["samples"] if s["method"] == "ngram")
    assert run["results"]["ngram"]["overall"]["mismatches"] == 4
    assert "LOSSLESS CHECK FAILED" in capsys.readouterr().err
    assert "| ngram |" in (tmp_path / "report.md").read_text()


def test_sampling_only_has_no_equality_check(chat_models, question_file, tmp_path, broken_ngram):
    assert bench(chat_models, question_file, tmp_path, "--methods", "ngram", "--mode", "sampling", "--no-plots") == 0


def test_bad_options_fail_before_loading(question_file, tmp_path, capsys):
    assert main(["bench", "--methods", "nope", "--questions", str(question_file), "--out", str(tmp_path)]) == 2
    assert "unknown methods nope" in capsys.readouterr().err
    assert main(["bench", "--questions", str(tmp_path / "none.jsonl"), "--out", str(tmp_path)]) == 2
    assert main(["bench", "--mode", "sampling", "--temperature", "0", "--out", str(tmp_path)]) == 2


def test_method_result_counts_peer_forwards(chat_models):
    from specdec.core.types import SamplingParams
    from specdec.models.loader import load_model
    import torch

    target = load_model(chat_models[0], torch.float32)
    spec = next(m for m in METHODS if m.name == "hf-lookup")
    (lookup,) = methods_mod.build_methods((spec,), target, methods_mod.MethodSettings())
    prompt = [1] + [40, 41, 42, 43] * 6
    result: MethodResult = lookup.generate(prompt, SamplingParams(max_new_tokens=8))
    assert len(result.token_ids) == 8
    assert result.num_target_forwards >= 1
    assert result.num_accepted_tokens == len(result.token_ids) - result.num_target_forwards
