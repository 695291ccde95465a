"""Loading refuses models whose KV cache a position-sliced commit would corrupt, before any weights load."""
from __future__ import annotations

import pytest
import torch

from specdec.errors import InvalidArgument
from specdec.models.loader import load_model

SMALL = dict(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, max_position_embeddings=256)


def _save(config, path):
    """A real tiny checkpoint (weights too), so only the check can stop it from loading."""
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return path


def _configs():
    from transformers import MistralConfig, Qwen2Config, Qwen3NextConfig

    return {
        "mistral-sliding": (MistralConfig(sliding_window=64, **SMALL), "sliding_attention"),
        "qwen2-sliding": (Qwen2Config(use_sliding_window=True, sliding_window=64, max_window_layers=1, **SMALL),
                          "sliding_attention"),
        "qwen3next-linear": (Qwen3NextConfig(**{**SMALL, "num_hidden_layers": 4}, head_dim=8, linear_num_key_heads=2,
                                             linear_num_value_heads=2, linear_key_head_dim=8, linear_value_head_dim=8,
                                             num_experts=2, num_experts_per_tok=1, moe_intermediate_size=16,
                                             shared_expert_intermediate_size=16), "linear_attention"),
    }


@pytest.mark.parametrize("name", ["mistral-sliding", "qwen2-sliding", "qwen3next-linear"])
def test_non_full_attention_cache_is_refused_with_the_reason(name, tmp_path):
    config, kind = _configs()[name]
    path = _save(config, tmp_path / name)
    with pytest.raises(InvalidArgument, match=rf"layers with a .*{kind}.* cache; specdec commits verified tokens "
                                              r"by slicing cache positions"):
        load_model(path, torch.float32)


def test_full_attention_models_still_load(tiny_target, tmp_path):
    from transformers import MistralConfig, Qwen2Config

    assert load_model(tiny_target, torch.float32).model.config.model_type == "llama"
    for name, config in {"mistral": MistralConfig(sliding_window=None, **SMALL),
                         "qwen2": Qwen2Config(use_sliding_window=False, **SMALL)}.items():
        assert load_model(_save(config, tmp_path / name), torch.float32).model.config.model_type == name
