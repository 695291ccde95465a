"""`specdec train draft --init DIR`: a draft model continued from a checkpoint (its weights and reduced vocabulary,
a fresh optimizer), with the learning-rate schedule the other recipes take."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

from specdec import Engine, SamplingParams
from specdec.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def weights(directory) -> dict[str, torch.Tensor]:
    return {k: v.float() for k, v in load_file(str(directory / "model.safetensors")).items()}


def test_draft_init_starts_from_the_checkpoint_not_a_fresh_draft(tiny_chat_target, tmp_path):
    common = ["--target", str(tiny_chat_target), "--shards", "0:4:2", "--max-new-tokens", "8",
              "--cache", str(tmp_path / "cache")]
    first, fresh, more = tmp_path / "first", tmp_path / "fresh", tmp_path / "more"
    assert main(["train", "draft", *common, "--steps", "40", "--out", str(first)]) == 0
    assert main(["train", "draft", *common, "--steps", "1", "--out", str(fresh)]) == 0
    assert main(["train", "draft", *common, "--steps", "1", "--out", str(more), "--init", str(first),
                 "--lr-schedule", "cosine", "--lr", "1e-3"]) == 0
    records = {d.name: json.loads((d / "recipe.json").read_text()) for d in (first, fresh, more)}
    # the first step's loss is the checkpoint's (40 steps in), not a new draft's
    assert records["more"]["result"]["first_loss"] < 0.8 * records["fresh"]["result"]["first_loss"]
    assert records["more"]["result"]["first_loss"] < 1.5 * records["first"]["result"]["final_loss"]
    # held-out agreement before training is the checkpoint's (the same held-out windows; bf16 rounding aside)
    assert records["more"]["result"]["start_heldout_top1_agreement"] == pytest.approx(
        records["first"]["result"]["heldout_top1_agreement"], abs=0.05)
    # the weights stay next to the checkpoint's, far from where a fresh draft's first step lands
    want, got, new = weights(first), weights(more), weights(fresh)
    assert sum(float((got[k] - want[k]).abs().sum()) for k in want) < 0.2 * sum(
        float((new[k] - want[k]).abs().sum()) for k in want)
    # the checkpoint's reduced vocabulary is kept (its head rows were trained), and the run is on record
    assert json.loads((more / "draft_vocab.json").read_text()) == json.loads((first / "draft_vocab.json").read_text())
    record = records["more"]
    assert record["config"]["lr_schedule"] == "cosine" and record["config"]["lr"] == 1e-3
    assert record["init"]["dir"] == str(first) and record["init"]["steps"] == 40
    assert record["init"]["result"]["steps"] == 40 and record["init"]["feature_seeds"] == [0]
    assert f"Started from `{first}`" in (more / "README.md").read_text()
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want_ids = Engine.from_pretrained(target=str(tiny_chat_target)).generate([1, 2, 3, 4], greedy).token_ids
    engine = Engine.from_pretrained(target=str(tiny_chat_target), drafter="draft", draft=str(more))
    assert engine.generate([1, 2, 3, 4], greedy).token_ids == want_ids


def test_draft_init_refuses_a_checkpoint_of_another_shape(tmp_path):
    from transformers import LlamaConfig

    from specdec.errors import InvalidArgument
    from specdec.training.draft import DraftRecipe, initial_draft

    target = SimpleNamespace(config=SimpleNamespace(vocab_size=96))
    with pytest.raises(InvalidArgument, match="not a draft-model checkpoint"):
        initial_draft(tmp_path, target, DraftRecipe())
    LlamaConfig(vocab_size=96, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, intermediate_size=128).save_pretrained(tmp_path)
    (tmp_path / "draft_vocab.json").write_text("[1, 2, 3]")
    with pytest.raises(InvalidArgument, match="hidden 64, 2 layers, vocabulary 96; the recipe trains hidden 256"):
        initial_draft(tmp_path, target, DraftRecipe())


def test_draft_schedule_keeps_the_first_drafts_constant_rate_and_decays_a_cosine_run():
    from specdec.training.common import learning_rate
    from specdec.training.draft import DraftRecipe

    constant = DraftRecipe()  # the shipped draft's first sitting: 2e-3 from the first step, no warm-up
    assert [learning_rate(constant, s, f) for s, f in ((0, 0.0), (600, 0.5), (1200, 1.0))] == [2e-3] * 3
    cosine = DraftRecipe(lr_schedule="cosine", lr=1e-3)
    rates = [learning_rate(cosine, i * 50, i / 20) for i in range(21)]
    assert rates[0] == pytest.approx(1e-3) and rates[-1] == pytest.approx(5e-5)
    assert all(a >= b for a, b in zip(rates, rates[1:]))


@pytest.mark.parametrize("args", [["train", "draft", "--init", "/no/such/dir"], ["train", "draft", "--resume"],
                                  ["train", "draft", "--lr", "0"], ["train", "eagle", "--lr-schedule", "cosine"],
                                  ["train", "eagle", "--init", "x"]])
def test_draft_arguments_refused_exit_2(args, capsys):
    assert main(args) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
