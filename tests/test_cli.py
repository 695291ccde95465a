"""The `specdec` command: one-line errors with exit code 2, and --json output."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

STATS_FIELDS = {"num_target_forwards", "num_draft_tokens", "num_accepted_tokens", "tau", "acceptance_rate",
                "elapsed_s", "tokens_per_s"}


def specdec(*args: str, timeout_s: float = 240) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "specdec.cli", *args], capture_output=True, text=True,
                          timeout=timeout_s)


@pytest.mark.parametrize("args, message", [
    (["generate", ""], "prompt is empty"),
    (["generate", "--max-new-tokens", "0", "hi"], "max_new_tokens must be > 0"),
    (["generate", "--temperature", "-1", "hi"], "temperature must be 0 (greedy) or in [0.01, 100], got -1.0"),
    (["generate", "--temperature", "1e-30", "hi"], "temperature must be 0 (greedy) or in [0.01, 100], got 1e-30"),
    (["generate", "--temperature", "inf", "hi"], "temperature must be 0 (greedy) or in [0.01, 100], got inf"),
    (["generate", "--top-p", "0", "hi"], "top_p must be in (0, 1]"),
    (["generate", "--top-p", "1.5", "hi"], "top_p must be in (0, 1]"),
    (["generate", "--target", "/no/such/dir", "hi"], "does not exist"),
    (["generate", "--drafter", "draft", "--draft", "/no/such/draft", "hi"], "does not exist"),
    (["generate", "--drafter", "suffix", "--tree-width", "2", "hi"], "takes no option tree_width"),
    (["generate", "--linear-kernel", "fast", "hi"], "linear_kernel must be one of auto, specdec, torch; got 'fast'"),
])
def test_bad_input_is_one_line_exit_2(args, message, smol_path):
    result = specdec(*args)
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("specdec: error:"), result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.stderr


def test_unknown_flag_exits_2():
    assert specdec("generate", "--no-such-flag", "hi").returncode == 2


def test_json_output_matches_plain_decoding(smol_path):
    runs = []
    for drafter in ("none", "ngram", "suffix"):
        result = specdec("generate", "--json", "--chat", "--drafter", drafter, "--max-new-tokens", "12",
                         'Repeat exactly: {"a": 1, "b": 2}')
        assert result.returncode == 0, result.stderr
        runs.append(json.loads(result.stdout))
    for out in runs:
        assert {"text", "token_ids"} | STATS_FIELDS <= set(out)
        assert len(out["token_ids"]) <= 12 and out["text"]
    assert runs[0]["token_ids"] == runs[1]["token_ids"] == runs[2]["token_ids"]
    assert runs[0]["tau"] == 1.0


def test_streams_text(smol_path):
    result = specdec("generate", "--chat", "--max-new-tokens", "8", "Say hello.")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert "tok/s" in result.stderr
