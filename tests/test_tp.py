"""Tensor parallelism of the in-process engine: `specdec generate --tp N` prints the same token ids.

SmolLM2 split three ways is checked through the served stack (tests/e2e/test_tp_serving.py); here the
CLI path runs on a tiny model, which splits two ways.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from test_cli import specdec


@pytest.fixture(scope="module")
def tiny_with_tokenizer(tmp_path_factory, smol_path):
    from e2e.tiny import make_tiny_llama  # 4 query / 2 key-value heads: splits 2 ways

    return str(make_tiny_llama(tmp_path_factory.mktemp("tp") / "tiny", seed=5, tokenizer_dir=Path(smol_path)))


def token_ids(*args: str) -> list[int]:
    result = specdec("generate", "--json", *args, timeout_s=400)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)["token_ids"]


def test_tp2_equals_tp1_on_small_model(tiny_with_tokenizer):
    args = ("--target", tiny_with_tokenizer, "--drafter", "ngram", "--max-new-tokens", "32", "one two one two one")
    want = token_ids(*args)
    assert len(want) == 32
    assert token_ids(*args, "--tp", "2") == want


def test_degree_that_does_not_divide_heads_names_valid_ones(smol_path):
    result = specdec("generate", "--tp", "2", "hi")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "specdec: error: --tp 2 does not divide the model's 9 attention heads and 3 key-value heads; "
        "valid degrees: 1, 3"]
