"""Recipe smoke runs: the feature cache is built once and reused; each recipe trains a few steps from the CLI."""
from __future__ import annotations

import json

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")


def test_every_recipe_trains_from_the_cli_and_reuses_the_feature_cache(tiny_chat_target, tmp_path, monkeypatch):
    common = ["--target", str(tiny_chat_target), "--steps", "2", "--shards", "0:3:2,1:2:0", "--max-new-tokens", "6",
              "--cache", str(tmp_path / "cache")]
    assert main(["train", "medusa", "--out", str(tmp_path / "medusa"), *common]) == 0
    feature_dirs = sorted(p.name for p in (tmp_path / "cache" / "features").iterdir())
    assert len(feature_dirs) == 2  # one per shard

    import specdec.training.features as features

    def no_target_run(*args, **kwargs):
        raise AssertionError("the feature cache must be reused, not rebuilt")

    monkeypatch.setattr(features, "generate_answers", no_target_run)
    for recipe in ("eagle", "draft"):
        assert main(["train", recipe, "--out", str(tmp_path / recipe), *common]) == 0
    assert sorted(p.name for p in (tmp_path / "cache" / "features").iterdir()) == feature_dirs
    for recipe in ("medusa", "eagle", "draft"):
        out = tmp_path / recipe
        record = json.loads((out / "recipe.json").read_text())
        assert record["result"]["steps"] == 2 and record["recipe"] == recipe
        assert (out / "loss.png").stat().st_size > 0 and (out / "README.md").is_file()
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = Engine.from_pretrained(target=str(tiny_chat_target)).generate([1, 2, 3, 4], greedy).token_ids
    for recipe in ("medusa", "eagle", "draft"):
        engine = Engine.from_pretrained(target=str(tiny_chat_target), drafter=recipe, draft=str(tmp_path / recipe))
        assert engine.generate([1, 2, 3, 4], greedy).token_ids == want
        if recipe == "draft":  # the draft's head computes only its reduced vocabulary: nothing else is drafted
            vocab = set(json.loads((tmp_path / "draft" / "draft_vocab.json").read_text()))
            runner = engine.drafter.runner
            assert runner.vocab_ids is not None and set(runner.vocab_ids.tolist()) == vocab
            tree = engine.drafter.new_session().propose([1, 2, 3, 4], 6, greedy, None)
            assert tree.num_nodes == 6 and set(tree.token_ids) <= vocab


def test_medusa_takes_a_cosine_schedule_and_bf16_features_from_the_cli(tiny_chat_target, tmp_path):
    common = ["--target", str(tiny_chat_target), "--steps", "3", "--shards", "0:3:2", "--max-new-tokens", "6",
              "--cache", str(tmp_path / "cache")]
    assert main(["train", "medusa", *common, "--out", str(tmp_path / "fp32")]) == 0
    out = tmp_path / "medusa"
    assert main(["train", "medusa", *common, "--out", str(out), "--lr-schedule", "cosine", "--lr", "2e-3",
                 "--bf16-features"]) == 0
    record = json.loads((out / "recipe.json").read_text())
    assert record["config"]["lr_schedule"] == "cosine" and record["config"]["lr"] == 2e-3
    assert record["result"]["steps"] == 3 and record["feature_shards"][0]["bf16"] is True
    metas = [json.loads((d / "meta.json").read_text()) for d in (tmp_path / "cache" / "features").iterdir()]
    assert sorted(m["config"]["bf16"] for m in metas) == [False, True]  # cached apart, neither reused for the other
    greedy = SamplingParams(max_new_tokens=12, ignore_eos=True)
    want = Engine.from_pretrained(target=str(tiny_chat_target)).generate([1, 2, 3, 4], greedy).token_ids
    engine = Engine.from_pretrained(target=str(tiny_chat_target), drafter="medusa", draft=str(out))
    assert engine.generate([1, 2, 3, 4], greedy).token_ids == want
    # a run continued from those heads records what it started from
    assert main(["train", "medusa", *common, "--out", str(tmp_path / "more"), "--init", str(out)]) == 0
    record = json.loads((tmp_path / "more" / "recipe.json").read_text())
    assert record["init"]["dir"] == str(out) and record["init"]["steps"] == 3
    assert f"Started from `{out}`" in (tmp_path / "more" / "README.md").read_text()


def test_medusa_init_loads_the_checkpoint_heads_of_the_same_shape(tmp_path):
    from specdec.drafters.medusa import MedusaConfig, MedusaHeads, save_medusa
    from specdec.errors import InvalidArgument
    from specdec.training.medusa import initial_heads

    heads = MedusaHeads(2, 8)
    for block in heads.blocks:
        torch.nn.init.normal_(block.weight)
    save_medusa(tmp_path, heads, torch.arange(5), MedusaConfig(2, 8, 16))
    loaded = initial_heads(tmp_path, 2, 8)
    for want, got in zip(heads.state_dict().values(), loaded.state_dict().values()):
        assert torch.equal(want.to(torch.bfloat16).float(), got)  # shipped bf16, trained on in float32
    assert all(p.requires_grad for p in loaded.parameters())
    with pytest.raises(InvalidArgument, match="3 of width 8"):
        initial_heads(tmp_path, 3, 8)


def test_medusa_schedule_keeps_the_first_heads_constant_rate_and_decays_a_cosine_run():
    from specdec.training.common import learning_rate
    from specdec.training.medusa import MedusaRecipe

    constant = MedusaRecipe()  # the shipped heads' recipe: 1e-3 from the first step, no warm-up
    assert [learning_rate(constant, s, f) for s, f in ((0, 0.0), (700, 0.5), (1400, 1.0))] == [1e-3] * 3
    cosine = MedusaRecipe(lr_schedule="cosine", min_lr_ratio=0.1)
    rates = [learning_rate(cosine, i * 50, i / 20) for i in range(21)]
    assert rates[0] == pytest.approx(1e-3) and rates[10] == pytest.approx(1e-4 + 0.5 * 9e-4)
    assert rates[-1] == pytest.approx(1e-4) and all(a >= b for a, b in zip(rates, rates[1:]))


def test_bad_budget_is_refused(capsys):
    assert main(["train", "medusa", "--minutes", "0"]) == 2
    assert "--minutes" in capsys.readouterr().err


def test_feature_set_split_and_offsets(tiny_features):
    from specdec.training.common import positions_with_offsets, reduced_vocab, to_reduced

    _, fs = tiny_features
    train, held = fs.split(3)
    assert held.num_seqs == 3 and train.num_seqs == fs.num_seqs - 3
    assert len(train.ids) + len(held.ids) == len(fs.ids) and held.cu_seqlens[0] == 0
    stride = fs.num_seqs // 3
    first = fs.select([stride - 1])  # held out: every stride-th sequence
    assert torch.equal(first.features, held.features[:len(first.ids)]) and torch.equal(first.ids, held.ids[:len(first.ids)])
    pos = positions_with_offsets(fs, 4)
    ends = fs.cu_seqlens[torch.searchsorted(fs.cu_seqlens, pos, right=True)]
    assert bool((pos + 4 < ends).all())
    vocab = reduced_vocab(fs, 10)
    assert len(vocab) == 10 and torch.equal(vocab, vocab.sort().values)
    labels = to_reduced(torch.tensor([int(vocab[3]), 95 if 95 not in vocab else int(vocab[0])]), vocab, 96)
    assert labels[0] == 3


def test_shard_ranges_expand_to_one_shard_per_seed():
    from specdec.commands.train import parse_shards
    from specdec.errors import InvalidArgument

    shards = parse_shards("3-5:7:2", 64)
    assert [(s.seed, s.num_prompts, s.num_passages, s.max_new_tokens) for s in shards] == [
        (3, 7, 2, 64), (4, 7, 2, 64), (5, 7, 2, 64)]
    with pytest.raises(InvalidArgument, match="empty"):
        parse_shards("5-3:7:2", 64)


def test_measure_labels_another_checkpoint_of_a_drafter():
    import argparse

    from specdec.training.measure import parse_draft

    parser = argparse.ArgumentParser()
    assert parse_draft(parser, "medusa-new=medusa:runs/m") == ("medusa-new", ("medusa", "runs/m"))
    with pytest.raises(SystemExit):
        parse_draft(parser, "medusa-new=medusa")


def test_a_signal_ends_the_training_loop_like_a_spent_budget():
    """SIGTERM mid-sitting stops the loop after the current step (so the recipe still writes its best
    weights) and puts the old handler back."""
    import os
    import signal

    from specdec.training.common import Budget

    before = signal.getsignal(signal.SIGTERM)
    bar = Budget(minutes=60.0).progress("test")
    seen = []
    for step in bar:
        seen.append(step)
        if step == 3:
            os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [0, 1, 2, 3] and bar.stopped_by == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is before
