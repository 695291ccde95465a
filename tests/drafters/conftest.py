"""Tiny trained self-drafters: a feature cache of the tiny target and a few optimisation steps each."""
from __future__ import annotations

import pytest
import torch


@pytest.fixture(scope="session")
def tiny_features(tiny_target, tmp_path_factory):
    from specdec.models.loader import load_model
    from specdec.training.features import FeatureCacheConfig, build_or_load

    target = load_model(tiny_target, torch.float32)
    prompts = [[(7 * i + j) % 90 + 3 for j in range(4)] for i in range(24)]
    config = FeatureCacheConfig(max_new_tokens=24, generate_batch_size=24)
    return target, build_or_load(target, config, tmp_path_factory.mktemp("features"), prompts)


@pytest.fixture(scope="session")
def tiny_medusa_dir(tiny_features, tmp_path_factory):
    from specdec.training.common import Budget
    from specdec.training.medusa import MedusaRecipe, train_medusa

    target, fs = tiny_features
    out = tmp_path_factory.mktemp("medusa")
    recipe = MedusaRecipe(num_tree_nodes=12, num_heldout_seqs=4, verify_cost_per_node=0.0)
    train_medusa(fs, target.model.get_output_embeddings().weight, recipe, Budget(max_steps=40), out)
    return out


@pytest.fixture(scope="session")
def tiny_eagle_dir(tiny_features, tmp_path_factory):
    from specdec.training.common import Budget
    from specdec.training.eagle import EagleRecipe, train_eagle

    target, fs = tiny_features
    out = tmp_path_factory.mktemp("eagle")
    train_eagle(fs, target.model, EagleRecipe(window_len=24, batch_size=4, num_heldout_seqs=4, top_k=3, depth=4,
                                              num_nodes=12), Budget(max_steps=10), out)
    return out


@pytest.fixture(scope="session")
def tiny_deep_target(tmp_path_factory):
    """A 4-layer tiny Llama: an EAGLE-3 head fuses its layers 1, 2 and 3."""
    from conftest import make_tiny_llama

    return str(make_tiny_llama(tmp_path_factory.mktemp("tiny-deep"), seed=5, layers=4))


@pytest.fixture(scope="session")
def tiny_fused(tiny_deep_target, tmp_path_factory):
    from specdec.models.loader import load_model
    from specdec.training.fused import FusedShard, build_shard

    target = load_model(tiny_deep_target, torch.float32)
    prompts = [[(7 * i + j) % 90 + 3 for j in range(4)] for i in range(24)]
    shard = FusedShard(seed=0, max_new_tokens=24, batch_size=24)
    return target, build_shard(target, shard, tmp_path_factory.mktemp("fused"), prompts)


@pytest.fixture(scope="session")
def tiny_eagle3_dir(tiny_fused, tmp_path_factory):
    from specdec.training.common import Budget
    from specdec.training.eagle3 import Eagle3Recipe, train_eagle3
    from specdec.training.fused import default_layers

    target, fs = tiny_fused
    out = tmp_path_factory.mktemp("eagle3")
    recipe = Eagle3Recipe(window_len=24, batch_size=4, num_heldout_seqs=4, top_k=3, depth=4, num_nodes=12, ttt_steps=3)
    train_eagle3(fs, target.model, recipe, Budget(max_steps=12), out, feature_layers=default_layers(4))
    return out


def assert_greedy_like_plain(target, drafter: str, draft_dir, must_accept: bool = False) -> None:
    """A trained self-drafter, as shipped and as a wide fixed-depth tree, decodes greedily exactly as plain
    decoding does, and really drafts (the check would pass vacuously on an empty draft); must_accept: and
    some of its drafts were accepted."""
    from specdec import Engine, SamplingParams

    prompts = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 43, 1, 2], [11, 12]]
    greedy = SamplingParams(max_new_tokens=32, ignore_eos=True)
    plain = Engine.from_pretrained(target=target)
    default = Engine.from_pretrained(target=target, drafter=drafter, draft=str(draft_dir))
    wide = Engine.from_pretrained(target=target, drafter=drafter, draft=str(draft_dir), top_k=4, num_nodes=30,
                                  adaptive=False, num_speculative_tokens=5)
    num_drafted = num_accepted = 0
    for prompt in prompts:
        want = plain.generate(prompt, greedy).token_ids
        for engine in (default, wide):
            out = engine.generate(prompt, greedy)
            assert out.token_ids == want
            num_drafted += out.stats.num_draft_tokens
            num_accepted += out.stats.num_accepted_tokens
    assert num_drafted > 0 and (num_accepted > 0 or not must_accept)
