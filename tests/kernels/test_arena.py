"""The weights' one buffer (specdec.kernels.arena): exact copies, in order, each on a cache line, and a lean
runner's products and LM head all read from it."""
from __future__ import annotations

import mmap

import pytest
import torch

from specdec.kernels import arena
from specdec.kernels.build import load_kernel


def test_place_copies_exactly_in_order_on_cache_lines():
    tensors = [torch.randn(3, 5), torch.randn(7).to(torch.bfloat16), torch.arange(10, dtype=torch.int64).view(2, 5),
               torch.empty(0, 4)]
    placed = arena.place(tensors)
    assert [p.shape for p in placed] == [t.shape for t in tensors]
    assert [p.dtype for p in placed] == [t.dtype for t in tensors]
    assert all(torch.equal(p, t) for p, t in zip(placed, tensors))
    assert all(p.data_ptr() % arena.ALIGN == 0 for p in placed if p.numel())
    live = [p for p in placed if p.numel()]
    assert [p.data_ptr() for p in live] == sorted(p.data_ptr() for p in live)  # one buffer, in order
    assert placed[0].data_ptr() % arena.HUGE_PAGE == 0 and len({p.untyped_storage().data_ptr() for p in live}) == 1
    tensors[0].zero_()
    assert placed[0].abs().sum() > 0  # copies, not views of the originals


@pytest.mark.parametrize("anonymous_maps", [True, False], ids=["mmap", "allocator"])
def test_buffer_is_aligned_and_outlives_its_mapping_object(anonymous_maps, monkeypatch):
    if not anonymous_maps:  # a system without anonymous mmap: torch's allocator, aligned all the same
        monkeypatch.delattr(mmap, "MAP_ANONYMOUS", raising=False)
    view = arena.buffer(3 << 20)[:100]
    view.fill_(3)
    assert int(view.sum()) == 300 and view.data_ptr() % arena.HUGE_PAGE == 0


def test_a_lean_runners_products_and_head_share_one_buffer(tiny_target):
    if load_kernel().module is None:
        pytest.skip("the kernels did not build here")
    from specdec.models.loader import load_model
    from specdec.models.runner import ModelRunner, RunnerConfig

    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(linear_kernel="specdec"))
    assert runner.lean is not None and runner.packed_head is not None
    layers = runner.decoder.layers
    packed = [m.packed for layer in layers for m in (layer.self_attn.q_proj, layer.self_attn.k_proj,
              layer.self_attn.v_proj, layer.self_attn.o_proj, layer.mlp.gate_proj, layer.mlp.up_proj,
              layer.mlp.down_proj)] + [runner.packed_head.packed]
    assert len({p.untyped_storage().data_ptr() for p in packed}) == 1
    starts = [p.data_ptr() for p in packed]
    assert starts == sorted(starts)  # the order a forward reads them, the head last
    # q|k|v is one weight viewed over its three parts, lying back to back: no copy of them
    attn = layers[0].self_attn
    assert attn.k_proj.packed.data_ptr() == attn.q_proj.packed.data_ptr() + attn.q_proj.packed.nbytes
    assert attn.v_proj.packed.data_ptr() == attn.k_proj.packed.data_ptr() + attn.k_proj.packed.nbytes


def test_a_model_on_transformers_walk_reads_its_products_from_one_buffer(tmp_path):
    if load_kernel().module is None:
        pytest.skip("the kernels did not build here")
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from specdec import Engine, SamplingParams
    from specdec.kernels.linear import PackedLinear

    torch.manual_seed(0)  # Qwen2's q / k / v have biases: the lean walk refuses it, transformers' walk runs it
    Qwen2ForCausalLM(Qwen2Config(vocab_size=96, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, use_sliding_window=False,
                                 tie_word_embeddings=False)).save_pretrained(tmp_path)
    prompt, params = [5, 6, 7, 8, 5, 6, 7, 8, 5, 6], SamplingParams(max_new_tokens=24, ignore_eos=True)
    plain = Engine.from_pretrained(target=str(tmp_path), drafter="none")
    runner = plain.runner
    assert runner.lean is None and runner.linear_kernel.kernel == "specdec"
    linears = [m for m in runner.model.modules() if isinstance(m, PackedLinear)] + [runner.packed_head]
    assert len({m.packed.untyped_storage().data_ptr() for m in linears}) == 1
    expected = plain.generate(prompt, params).token_ids
    assert Engine.from_pretrained(target=str(tmp_path), drafter="ngram").generate(prompt, params).token_ids == expected
