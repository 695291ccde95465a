"""`specdec loadtest` against a running router (over gRPC and over the HTTP API), and its input errors."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from specdec.client import Client
from specdec.launch import Stack


def loadtest(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec.cli", "loadtest", *args], capture_output=True, text=True,
                          timeout=300)


def loadtest_admitting(stack: Stack, *args: str) -> tuple[subprocess.CompletedProcess, int]:
    """`specdec loadtest --server` against the stack, and how many requests its router admitted meanwhile."""
    with Client(stack.address) as client:
        admitted_before = client.server_info().num_admitted
    result = loadtest("--server", stack.address, *args)
    with Client(stack.address) as client:
        return result, client.server_info().num_admitted - admitted_before


def test_reports_every_level(drafting_stack: Stack, tmp_path):
    """Against a stack that drafts at every step, so speculation and batching must show in the figures."""
    plot = tmp_path / "throughput.png"
    result = loadtest("--server", drafting_stack.address, "--concurrency", "1,3", "--requests", "3",
                      "--max-new-tokens", "16", "--json", "--plot", str(plot))
    assert result.returncode == 0, result.stderr
    (levels,) = json.loads(result.stdout).values()
    assert [level["concurrency"] for level in levels] == [1, 3]
    for level in levels:
        assert level["num_errors"] == 0 and level["num_requests"] == 3
        assert level["output_tokens_per_s"] > 0
        assert 0 < level["ttft_p50_s"] <= level["ttft_p99_s"]
        assert 0 < level["tpot_p50_s"] <= level["tpot_p99_s"]
    # tau: tokens per target forward. The draft (a lightly noised copy of the target) is often accepted,
    # so every level emitted more than one token per forward, and tau > 1 exactly when drafts were accepted.
    assert all(level["tau"] > 1.0 and level["acceptance_rate"] > 0.0 for level in levels), levels
    # The server's own sequences per verify forward: exactly 1 with one client at a time, more than 1
    # once three clients share the target.
    one, three = levels
    assert one["mean_batch_size"] == 1.0 and three["mean_batch_size"] > 1.0, (one, three)
    assert plot.stat().st_size > 1000


def test_drives_the_http_api(draft_stack: Stack):
    result, admitted = loadtest_admitting(draft_stack, "--http", f"http://{draft_stack.http_address}",
                                          "--concurrency", "2", "--requests", "3", "--max-new-tokens", "12", "--json")
    assert result.returncode == 0, result.stderr
    ((label, (level,)),) = json.loads(result.stdout).items()
    assert label.endswith("over HTTP") and "over HTTP" in result.stderr
    assert level["num_errors"] == 0 and level["num_requests"] == 3 and level["output_tokens_per_s"] > 0
    assert 0 < level["ttft_p50_s"] and 0 < level["tpot_p50_s"] and level["tau"] >= 1.0
    assert level["mean_batch_size"] >= 1.0  # the server's figure, asked over gRPC
    assert admitted == 3  # they went through this router


def test_bad_levels_exit_2():
    result = loadtest("--server", "127.0.0.1:1", "--concurrency", "1,x")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "specdec: error: --concurrency must be comma-separated integers, got '1,x'"]


def test_bad_http_url_exits_2():
    result = loadtest("--http", "ftp://127.0.0.1:1")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "specdec: error: --http must be http://HOST:PORT or https://HOST:PORT, got 'ftp://127.0.0.1:1'"]


def test_local_stack_config_has_every_serve_default():
    """--compare builds `specdec serve`'s stack from its own namespace: every option serve reads must be there."""
    import argparse

    from specdec.commands.loadtest import local_stack_config

    args = argparse.Namespace(target=None, draft_in="worker", dtype="auto", drafter_options="")
    spec, plain = local_stack_config(args, "ngram"), local_stack_config(args, None)
    assert [d.drafter for d in spec.drafts] == ["ngram"] and plain.drafts == ()
    assert spec.targets[0].linear_kernel == "auto" and spec.targets[0].device == "auto"


def test_local_stacks_share_the_dtype_asked_for():
    """--dtype bfloat16 reaches both stacks' targets (and the draft worker): a comparison in one dtype."""
    import argparse

    from specdec.commands.loadtest import local_stack_config

    args = argparse.Namespace(target=None, draft_in="worker", dtype="bfloat16", drafter_options="")
    spec, plain = local_stack_config(args, "draft"), local_stack_config(args, None)
    assert [t.dtype for t in spec.targets + plain.targets] == ["bfloat16", "bfloat16"]
    assert [d.dtype for d in spec.drafts] == ["bfloat16"]


def test_local_stack_can_draft_inside_the_target():
    import argparse

    from specdec.commands.loadtest import local_stack_config

    spec = local_stack_config(argparse.Namespace(target=None, draft_in="target", dtype="auto", drafter_options=""), "suffix")
    assert spec.drafts == () and [t.drafter for t in spec.targets] == ["suffix"]


def test_the_default_drafter_is_the_hybrid_for_the_embedded_target_only():
    """The embedded target ships Medusa heads, so its local stack drafts with the hybrid; a checkpoint of your
    own has none, so it gets serve's default, prompt lookup."""
    import argparse

    from specdec.commands.loadtest import add_parser, default_drafter, local_stack_config
    from specdec.commands.serve import DEFAULT_DRAFTER

    assert default_drafter(None) == "hybrid" and default_drafter("/some/checkpoint") == DEFAULT_DRAFTER == "ngram"
    parser = argparse.ArgumentParser()
    add_parser(parser.add_subparsers())
    args = parser.parse_args(["loadtest", "--compare"])
    assert args.drafter is None  # resolved against --target in run()
    spec = local_stack_config(args, default_drafter(args.target))
    assert spec.drafts == () and [t.drafter for t in spec.targets] == ["hybrid"]  # it runs inside the target


def test_drafter_lists_need_compare_and_known_names():
    from specdec.commands.loadtest import drafter_list

    assert drafter_list("ngram", compare=False) == ["ngram"]
    assert drafter_list("ngram,eagle3", compare=True) == ["ngram", "eagle3"]
    for text, compare in (("ngram,eagle3", False), ("ngram,bogus", True), ("ngram,ngram", True)):
        result = loadtest("--drafter", text, *(["--compare"] if compare else []))
        assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_rounds_repeat_each_level_and_report_the_median_run(draft_stack: Stack):
    result, admitted = loadtest_admitting(draft_stack, "--concurrency", "1", "--requests", "2", "--rounds", "3",
                                          "--max-new-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    ((_, (level,)),) = json.loads(result.stdout).items()
    assert level["num_requests"] == 2 and level["num_errors"] == 0
    assert admitted == 6  # three runs of the level
    assert loadtest("--server", "127.0.0.1:1", "--rounds", "0").returncode == 2


def test_warmup_requests_go_first_and_are_not_counted(draft_stack: Stack):
    """--warmup N: N requests before the first level, none of them in the level's figures (a server given
    with --server is warmed only when asked: the test above counts exactly its measured requests)."""
    result, admitted = loadtest_admitting(draft_stack, "--concurrency", "1", "--requests", "2", "--warmup", "3",
                                          "--max-new-tokens", "8", "--json")
    assert result.returncode == 0, result.stderr
    ((label, (level,)),) = json.loads(result.stdout).items()
    assert label == "server"  # its drafter is the server's, not a local stack's default
    assert level["num_requests"] == 2 and level["num_errors"] == 0
    assert admitted == 5  # the 3 warm-ups went first, uncounted
    bad = loadtest("--server", "127.0.0.1:1", "--warmup", "-1")
    assert bad.returncode == 2 and bad.stderr.strip().splitlines() == ["specdec: error: --warmup must be >= 0, got -1"]


def test_median_run_is_one_whole_run():
    from specdec.loadtest import LevelResult, median_run

    runs = [LevelResult(1, 4, 0, tps, 0.1, 0.2, 0.01, 0.02, 0.5, 1.5, 1.0) for tps in (30.0, 10.0, 20.0, 40.0)]
    assert median_run(runs) is runs[2] and median_run(runs[:1]) is runs[0]


def test_paired_speedups_divide_round_by_round():
    from specdec.loadtest import LevelResult, paired_speedups

    def level(tps: float) -> LevelResult:
        return LevelResult(1, 4, 0, tps, 0.1, 0.2, 0.01, 0.02, 0.5, 1.5, 1.0)

    assert paired_speedups([level(30.0), level(45.0)], [level(20.0), level(30.0)]) == [1.5, 1.5]
    assert paired_speedups([level(30.0)], [level(0.0)]) == []  # a round with no plain output has no ratio


@pytest.fixture
def fake_stacks(monkeypatch) -> dict:
    """`specdec loadtest` with no stacks started and no request sent: each local stack's address is its label, and
    a level's throughput is `fake["throughputs"][label][round]` (a level's round: its first prompt // requests,
    modulo 3), 10 tok/s where none is given. fake["calls"] lists (address, first prompt, requests) per level run."""
    import contextlib

    import specdec.loadtest
    from specdec.commands import loadtest as command
    from specdec.loadtest import LevelResult

    fake = {"calls": [], "throughputs": {}}

    @contextlib.contextmanager
    def fake_stack(args, drafter):
        yield ("speculative" if drafter else "no speculation", None)

    def fake_level(address, concurrency, num_requests, params, first_index=0, **kwargs):
        fake["calls"].append((address, first_index, num_requests))
        tps = fake["throughputs"].get(address, [10.0] * 3)[first_index // num_requests % 3]
        return LevelResult(concurrency, num_requests, 0, tps, 0.1, 0.2, 0.01, 0.02, 0.5, 1.5, 1.0)

    monkeypatch.setattr(command, "_stack", fake_stack)
    monkeypatch.setattr(specdec.loadtest, "run_level", fake_level)
    return fake


def test_compare_reports_the_median_of_paired_rounds(fake_stacks, capsys):
    """--compare: each stack's median run, plus the median of round-by-round ratios, which pair runs on
    the same prompts (here the median runs, 200 / 100, give 2.0; the paired rounds 1.5, 1.6, 4.0)."""
    from specdec.cli import main

    throughputs = fake_stacks["throughputs"]
    throughputs.update({"speculative": [150.0, 200.0, 400.0], "no speculation": [100.0, 125.0, 100.0]})
    assert main(["loadtest", "--compare", "--drafter", "ngram", "--concurrency", "1", "--requests", "2",
                 "--rounds", "3", "--json"]) == 0
    # first each local stack's warm-up (16 requests, prompts after all 3 rounds' 6), uncounted; then the
    # rounds, both stacks on the same prompts in a round
    calls = fake_stacks["calls"]
    assert sorted(calls[:2]) == [("no speculation", 6, 16), ("speculative", 6, 16)]
    assert sorted(calls[2:]) == sorted((a, i, 2) for a in throughputs for i in (0, 2, 4))
    out = capsys.readouterr()
    result = json.loads(out.out)
    assert result["speculative"][0]["output_tokens_per_s"] == 200.0
    assert result["speculative"][0]["paired_speedup"] == 1.6
    assert result["no speculation"][0]["paired_speedup"] == 0.0
    assert "1.60x no speculation (median over rounds, each on the same prompts: 1.50, 1.60, 4.00)" in out.err


def test_compare_runs_three_rounds_of_48_requests_unless_told(fake_stacks):
    """One round's paired ratio moves by about what speculation gains under load, so --compare alone runs three
    rounds of 48 requests a level; --rounds and --requests still decide, and without --compare one round of 16 is
    the default."""
    from specdec.cli import main

    calls = fake_stacks["calls"]
    for argv, rounds in ((["--compare"], 3), (["--compare", "--rounds", "2"], 2), ([], 1)):
        calls.clear()
        assert main(["loadtest", *argv, "--concurrency", "1", "--requests", "5", "--warmup", "0"]) == 0
        assert len(calls) == rounds * (2 if "--compare" in argv else 1), (argv, calls)
    for argv, requests in ((["--compare"], 48), (["--compare", "--requests", "7"], 7), ([], 16)):
        calls.clear()
        assert main(["loadtest", *argv, "--concurrency", "1", "--rounds", "1", "--warmup", "0"]) == 0
        assert {n for _, _, n in calls} == {requests}, (argv, calls)


def test_distinct_prompts_never_repeat_and_repeated_ones_cycle():
    from specdec.loadtest_prompts import MOST_DISTINCT, REPEATED, prompt_for

    distinct = [prompt_for(i, repeated=False) for i in range(MOST_DISTINCT)]
    assert len(set(distinct)) == MOST_DISTINCT
    assert {p.split(": ")[0] for p in distinct[:8]} >= {"Repeat exactly", "Summarise"}  # the eight kinds
    assert [prompt_for(i, repeated=True) for i in range(10)] == [*REPEATED, *REPEATED[:2]]


def test_a_level_sends_its_own_slice_of_the_prompts(monkeypatch):
    """Each run of a level asks the prompts from first_index on, so rounds and levels never resend one."""
    from specdec import loadtest as lt
    from specdec.core.types import SamplingParams
    from specdec.loadtest_prompts import prompt_for

    sent = []

    class Stats:
        num_draft_tokens = num_accepted_tokens = 0
        num_target_forwards = 2

    def fake_stream(address, timeout_s, options):
        def stream(prompt, params):
            sent.append(prompt)
            yield 1, None
            yield 1, Stats()
        class Session:
            def close(self):
                pass
        return Session(), stream

    monkeypatch.setattr(lt, "_grpc_stream", fake_stream)
    monkeypatch.setattr(lt, "_batch_counts", lambda address, options: None)
    level = lt.run_level("127.0.0.1:1", 2, 5, SamplingParams(max_new_tokens=2), first_index=7)
    assert level.num_errors == 0 and level.num_requests == 5
    assert sorted(sent) == sorted(prompt_for(i, repeated=False) for i in range(7, 12))
    sent.clear()
    lt.run_level("127.0.0.1:1", 1, 3, SamplingParams(max_new_tokens=2), repeated=True)
    assert sent == [prompt_for(i, repeated=True) for i in range(3)]
