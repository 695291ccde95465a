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


def test_train_resumes_and_records_the_recipe(tiny_deep_chat_target, tmp_path):
    out = tmp_path / "eagle3"
    common = ["--target", str(tiny_deep_chat_target), "--shards", "0:3:2,1:3:1", "--max-new-tokens", "8",
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
    history = second["result"]["sitting_history"]
    assert [h["steps"] for h in history] == [2, 3] and [h["sitting"] for h in history] == [1, 2]
    assert all(h["num_train_tokens"] == second["num_train_tokens"] for h in history)
    progress = torch.load(out / "train_state.pt", weights_only=False)["progress"]
    assert len(progress["losses"]) == 5 and all(math.isfinite(x) for x in progress["losses"])
    assert (progress["epoch"], progress["position"]) != position  # the data position moved on
    # a third sitting adds a shard: the held-out sequences stay the first sitting's (none of them trained on)
    more = [*common[:3], "0:3:2,1:3:1,2:3:1", *common[4:]]
    assert main(["train", "eagle3", "--steps", "1", "--resume", "--lr-schedule", "cosine", "--lr", "2e-4", *more]) == 0
    assert torch.load(out / "train_state.pt", weights_only=False)["heldout_seqs"] == state["heldout_seqs"]
    third = json.loads((out / "recipe.json").read_text())
    assert third["num_feature_tokens"] > second["num_feature_tokens"]
    assert third["config"]["lr_schedule"] == "cosine" and third["result"]["sitting_history"][-1]["steps"] == 1
    assert third["config"]["lr"] == 2e-4 and third["result"]["sitting_history"][-1]["peak_lr"] == 2e-4
    assert "3. `" in (out / "README.md").read_text()  # the README lists every sitting's command
    assert "cosine learning rate from 0.0002" in (out / "README.md").read_text()
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = Engine.from_pretrained(target=str(tiny_deep_chat_target)).generate([1, 2, 3, 4], greedy).token_ids
    engine = Engine.from_pretrained(target=str(tiny_deep_chat_target), drafter="eagle3", draft=str(out))
    assert engine.generate([1, 2, 3, 4], greedy).token_ids == want


def test_cosine_schedule_decays_over_the_sitting_and_warms_up_once():
    from specdec.training.eagle3 import Eagle3Recipe, learning_rate

    cosine = Eagle3Recipe(lr=1e-3, warmup_steps=10, lr_schedule="cosine", min_lr_ratio=0.1)
    constant = Eagle3Recipe(lr=1e-3, warmup_steps=10)
    assert learning_rate(constant, 0, 0.0) == pytest.approx(1e-4)  # warm-up from the first sitting's first step
    assert learning_rate(constant, 500, 0.9) == pytest.approx(1e-3)
    # a resumed sitting (global step 500) starts at the peak, halves its excess at mid-budget, ends at the floor
    assert learning_rate(cosine, 500, 0.0) == pytest.approx(1e-3)
    assert learning_rate(cosine, 900, 0.5) == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert learning_rate(cosine, 1300, 1.0) == pytest.approx(1e-4)
    rates = [learning_rate(cosine, 500 + i, i / 20) for i in range(21)]
    assert all(a >= b for a, b in zip(rates, rates[1:]))


@pytest.mark.parametrize("args", [["train", "eagle", "--resume"], ["train", "eagle", "--lr-schedule", "cosine"], ["train", "draft", "--cached-only"],
                                  ["train", "eagle3", "--minutes", "0"], ["train", "eagle3", "--max-new-tokens", "0"],
                                  ["train", "eagle3", "--shards", "x:y"], ["train", "eagle", "--lr", "1e-4"],
                                  ["train", "eagle3", "--lr", "0"], ["train", "medusa", "--lr", "0"],
                                  ["train", "medusa", "--resume"], ["train", "eagle3", "--bf16-features"],
                                  ["train", "eagle", "--init", "x"]])
def test_bad_arguments_exit_2(args, capsys):
    assert main(args) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
