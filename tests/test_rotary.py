"""Rotary tables: a position's cos/sin are the same bits in every forward, whatever else the forward holds."""
from __future__ import annotations

import torch

from specdec import Engine
from specdec.models import rotary


def test_a_position_gets_the_same_bits_in_any_call_and_near_transformers(tiny_target):
    engine = Engine.from_pretrained(target=tiny_target)
    table = engine.runner.decoder.rotary_emb
    assert isinstance(table, rotary.RotaryTable)
    x = torch.zeros(1, dtype=torch.bfloat16)
    whole_cos, whole_sin = table(x, torch.arange(64)[None])  # [1, 64, d]
    part_cos, part_sin = table(x, torch.tensor([[40, 41, 7, 63]]))
    assert torch.equal(part_cos[0], whole_cos[0, [40, 41, 7, 63]]) and torch.equal(part_sin[0], whole_sin[0, [40, 41, 7, 63]])
    batch_cos, _ = table(x, torch.tensor([[3, 4], [40, 41]]))
    assert torch.equal(batch_cos[1], whole_cos[0, 40:42])
    assert table.tables[torch.bfloat16][0].shape[0] >= engine.runner.config.max_position_embeddings
    far = max(rotary.MIN_POSITIONS, engine.runner.config.max_position_embeddings) + 10
    far_cos, _ = table(x, torch.tensor([[far]]))  # past the stated limit on a CPU: grows, old rows unchanged
    assert torch.equal(table(x, torch.arange(64)[None])[0], whole_cos)
    assert far_cos.shape == (1, 1, whole_cos.shape[-1])
    # the module it replaced computes the same angles in float32: values within a step of its dtype
    want_cos, want_sin = table.original(x.float(), torch.arange(64)[None])
    assert torch.allclose(whole_cos.float(), want_cos, atol=1e-2) and torch.allclose(whole_sin.float(), want_sin, atol=1e-2)
    exact = table(torch.zeros(1), torch.arange(64)[None])[0]
    assert torch.allclose(exact, want_cos, atol=1e-5)


def test_install_is_idempotent_and_leaves_scaled_ropes_alone(tiny_target):
    engine = Engine.from_pretrained(target=tiny_target)
    decoder = engine.runner.decoder
    first = decoder.rotary_emb
    assert rotary.install(decoder) and decoder.rotary_emb is first

    class Scaled(torch.nn.Module):
        rope_type = "dynamic"
        inv_freq = torch.ones(4)

    holder = torch.nn.Module()
    holder.rotary_emb = Scaled()
    assert not rotary.install(holder) and isinstance(holder.rotary_emb, Scaled)
