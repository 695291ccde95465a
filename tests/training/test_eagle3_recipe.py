"""`specdec train eagle3`: fused shards from the CLI, a sitting that resumes (steps and data position go on),
recipe.json, and bad arguments refused with exit code 2."""
from __future__ import annotations

import json
import math

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def tiny_chat_target(tmp_path_factory, smol_path):
    """A tiny random 4-layer Llama with SmolLM2's tokenizer: the CLI path end to end, in seconds."""
    from transformers import AutoTokenizer

    from conftest import make_tiny_llama

    path = make_tiny_llama(tmp_path_factory.mktemp("tiny-chat3"), seed=4, hidden=64, layers=4, vocab=49152,
                           eos_token_id=2)
    AutoTokenizer.from_pretrained(smol_path).save_pretrained(path)
    return path


def test_train_resumes_and_records_the_recipe(tiny_chat_target, tmp_path):
    out = tmp_path / "eagle3"
    common = ["--target", str(tiny_chat_target), "--shards", "0:3:2,1:3:1", "--max-new-tokens", "8",
              "--cache", str(tmp_path / "cache"), "--out", str(out)]
    assert main(["train", "eagle3", "--steps", "2", *common]) == 0
    first = json.loads((out / "recipe.json").read_text())
    assert first["recipe"] == "eagle3" and first["result"]["steps"] == 2 and first["result"]["sittings"] == 1
    assert first["num_train_tokens"] > 0 and first["num_feature_tokens"] >= first["num_train_tokens"]
    assert "train_minutes" in first["result"] and len(first["feature_shards"]) == 2
    state = torch.load(out / "train_state.pt", weights_only=False)
    position = (state["progress"]["epoch"], state["progress"]["position"])
    assert main(["train", "eagle3", "--steps", "3", "--resume", "--cached-only", *common]) == 0
    second = json.loads((out / "recipe.json").read_text())
    assert second["result"]["steps"] == 5 and second["result"]["steps_this_sitting"] == 3
    assert second["result"]["sittings"] == 2
    progress = torch.load(out / "train_state.pt", weights_only=False)["progress"]
    assert len(progress["losses"]) == 5 and all(math.isfinite(x) for x in progress["losses"])
    assert (progress["epoch"], progress["position"]) != position  # the data position moved on
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = Engine.from_pretrained(target=str(tiny_chat_target)).generate([1, 2, 3, 4], greedy).token_ids
    engine = Engine.from_pretrained(target=str(tiny_chat_target), drafter="eagle3", draft=str(out))
    assert engine.generate([1, 2, 3, 4], greedy).token_ids == want


@pytest.mark.parametrize("args", [["train", "eagle", "--resume"], ["train", "draft", "--cached-only"],
                                  ["train", "eagle3", "--minutes", "0"], ["train", "eagle3", "--max-new-tokens", "0"],
                                  ["train", "eagle3", "--shards", "x:y"]])
def test_bad_arguments_exit_2(args, capsys):
    assert main(args) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
