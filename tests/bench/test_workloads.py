"""The workload prompts and `specdec bench --workloads` on the tiny chat model: the shipped files,
the loader's errors, and the report's figures adding up (histograms vs forwards, tau, speedup)."""
from __future__ import annotations

import json

import pytest

from specdec.bench.main import resolve_questions_path
from specdec.bench.workloads import DEFAULT_DIR, ORDER, load_workloads, read_workload
from specdec.cli import main
from specdec.errors import InvalidArgument


def test_the_shipped_workloads():
    directory = resolve_questions_path(DEFAULT_DIR)
    prompts = load_workloads(directory)
    assert [w for w in dict.fromkeys(p.workload for p in prompts)] == list(ORDER)
    assert all(len([p for p in prompts if p.workload == w]) >= 3 for w in ORDER)
    assert {p.temperature for p in prompts if p.workload == "creative"} == {1.0}
    assert {p.temperature for p in prompts if p.workload != "creative"} == {0.0}
    agent = [p for p in prompts if p.workload == "agent"]
    assert all(any(role == "assistant" for role, _ in p.messages) for p in agent)  # loops resend earlier output
    assert [p.prompt_id for p in load_workloads(directory, ("json", "code"), 1)] == ["code-rename", "json-extract-people"]


def test_loader_errors(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}]}\n{"id": 2}\n')
    with pytest.raises(InvalidArgument, match=r"a.jsonl:2"):
        read_workload(tmp_path / "a.jsonl")
    (tmp_path / "a.jsonl").write_text('{"id": 1, "messages": [{"role": "user", "content": "hi"}, '
                                      '{"role": "assistant", "content": "yo"}]}\n')
    with pytest.raises(InvalidArgument, match="last message must be the user's"):
        read_workload(tmp_path / "a.jsonl")
    with pytest.raises(InvalidArgument, match="unknown workloads nope"):
        load_workloads(tmp_path, ("nope",))
    with pytest.raises(InvalidArgument, match="does not exist"):
        load_workloads(tmp_path / "missing")


@pytest.fixture()
def workload_dir(tmp_path):
    directory = tmp_path / "workloads"
    directory.mkdir()
    chat = [{"role": "user", "content": "Repeat: abc abc abc"}]
    (directory / "json.jsonl").write_text("".join(json.dumps({"id": f"j{i}", "messages": chat}) + "\n" for i in range(3)))
    (directory / "creative.jsonl").write_text(json.dumps({"id": "c", "temperature": 1.0, "messages": chat}) + "\n")
    return directory


def test_workload_report_adds_up(chat_models, workload_dir, tmp_path, capsys):
    target, _ = chat_models
    out = tmp_path / "out"
    assert main(["bench", "--workloads", "--workload-dir", str(workload_dir), "--target", target, "--methods", "ngram",
                 "suffix", "--max-new-tokens", "12", "--num-speculative-tokens", "4", "--out", str(out),
                 "--no-progress"]) == 0
    report = json.loads((out / "report.json").read_text())
    assert report["ok"] and report["settings"]["workloads"] == ["json", "creative"]
    assert [m["name"] for m in report["methods"]] == ["plain", "ngram", "suffix"]
    assert len(report["samples"]) == (2 + 1) * 3  # 2 prompts per workload by default (creative has 1)
    for s in report["samples"]:
        # one histogram entry per drafted step; every step is drafted or not
        assert len(s["accepted_lengths"]) + s["num_undrafted_steps"] == s["num_target_forwards"]
        assert sum(s["accepted_lengths"]) <= s["num_accepted_tokens"]  # the last step may be cut short
        assert (s["mismatch"] is None) == (s["workload"] == "creative")
        if s["method"] == "plain":
            assert s["num_draft_tokens"] == 0 and s["accepted_lengths"] == []
    for workload in ("json", "creative", "overall"):
        row = report["results"][workload]
        assert row["plain"]["speedup"] == pytest.approx(1.0)
        assert row["plain"]["drafted_step_share"] == 0
        assert all(len(m["accepted_length_histogram"]) == 5 for m in row.values())
    # the json prompts are the same chat: the second is drafted from the first one's answer
    assert report["results"]["json"]["suffix"]["drafted_step_share"] > 0
    assert {g["workload"] for g in report["goals"]} == {"agent", "json", "code"}
    json_goal = next(g for g in report["goals"] if g["workload"] == "json")
    assert json_goal["tau"] == report["results"]["json"]["suffix"]["tau"]
    assert (out / "speedup_vs_acceptance_workloads.png").stat().st_size > 0
    assert (out / "accepted_length_histogram.png").stat().st_size > 0
    assert "| suffix |" in (out / "report.md").read_text()
    assert "goal json: suffix tau" in capsys.readouterr().err


def test_workload_options_fail_before_loading(workload_dir, tmp_path, capsys):
    assert main(["bench", "--workloads", "nope", "--workload-dir", str(workload_dir), "--out", str(tmp_path)]) == 2
    assert "unknown workloads nope" in capsys.readouterr().err
    assert main(["bench", "--workloads", "--workload-dir", str(workload_dir), "--methods", "hf-lookup",
                 "--out", str(tmp_path)]) == 2
