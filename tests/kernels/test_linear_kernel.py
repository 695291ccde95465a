"""linear_kernel = specdec end to end: layers swapped and back, greedy speculative output equal to
plain decoding token for token (float32, and bfloat16 where the CPU runs it natively), and sampled
tokens following the target's exact distribution (G-test, tests/distribution.py)."""
from __future__ import annotations

import pytest
import torch

from distribution import exact_joint, g_test_kl, target_next_probs
from specdec import Engine, SamplingParams
from specdec.errors import InvalidArgument
from specdec.kernels.build import load_kernel
from specdec.kernels.linear import PackedLinear, choose, install
from specdec.models.loader import load_model
from specdec.models.runner import ModelRunner, RunnerConfig

KERNEL = load_kernel()
needs_kernel = pytest.mark.skipif(KERNEL.module is None, reason=f"rowgemm unavailable: {KERNEL.reason}")
CPU = torch.device("cpu")


def test_choice_keeps_torch_where_the_kernel_cannot_run():
    assert choose("torch", CPU, torch.float32, False).kernel == "torch"
    assert "cuda" in choose("specdec", torch.device("cuda"), torch.float32, False).reason
    assert "tensor-parallel" in choose("auto", CPU, torch.float32, True).reason
    assert choose("auto", CPU, torch.float16, False).kernel == "torch"
    with pytest.raises(InvalidArgument, match="linear_kernel must be one of auto, specdec, torch"):
        choose("fast", CPU, torch.float32, False)
    with pytest.raises(InvalidArgument, match="linear_kernel"):
        RunnerConfig(linear_kernel="fast")


@needs_kernel
def test_install_swaps_layers_and_back_exactly(tiny_target):
    model = load_model(tiny_target, torch.float32).model
    weights = {n: m.weight.clone() for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)}
    ids = torch.tensor([[3, 1, 4, 1, 5, 9, 2, 6]])
    with torch.inference_mode():
        want = model(input_ids=ids).logits
    assert install(model, "specdec").kernel == "specdec"
    assert install(model, "specdec").kernel == "specdec"  # a second runner on the same model: no change
    packed = {n for n, m in model.named_modules() if isinstance(m, PackedLinear)}
    assert packed == set(weights) - {"lm_head"}  # 7 per layer; the tied head is packed by the runner
    norms = [m for m in model.modules() if type(m).__name__ == "FusedRMSNorm"]
    assert len(norms) == 2 * model.config.num_hidden_layers + 1
    assert all(type(m.original).__name__ == "LlamaRMSNorm" for m in norms)
    with torch.inference_mode():
        torch.testing.assert_close(model(input_ids=ids).logits, want, rtol=1e-5, atol=1e-4)
    assert install(model, "torch").kernel == "torch"
    for name, module in model.named_modules():
        if name in weights:
            assert type(module) is torch.nn.Linear and torch.equal(module.weight, weights[name])


@needs_kernel
def test_runner_logits_use_packed_head(tiny_target):
    model = load_model(tiny_target, torch.float32).model
    runner = ModelRunner(model, config=RunnerConfig(linear_kernel="specdec"))
    assert runner.packed_head is not None and runner.linear_kernel.kernel == "specdec"
    hidden = torch.randn(5, model.config.hidden_size)
    torch.testing.assert_close(runner.logits(hidden), hidden @ runner.head_weight.T, rtol=1e-5, atol=1e-4)
    assert torch.equal(runner.logits(hidden)[2:3], runner.logits(hidden[2:3]))  # row-invariant head too


SMOL_PROMPTS = ['Repeat the following JSON exactly: {"name": "Ada", "age": 36, "city": "London"}',
                "Write a Python function that returns the square of a number."]
DTYPES = ["float32"] + (["bfloat16"] if KERNEL.runs_bf16 else [])


@needs_kernel
@pytest.mark.parametrize("dtype", DTYPES)
def test_greedy_speculative_equals_plain_on_smollm(smol_path, dtype):
    params = SamplingParams(max_new_tokens=48)
    plain = Engine.from_pretrained(target=smol_path, dtype=dtype, linear_kernel="specdec")
    assert plain.runner.linear_kernel.kernel == "specdec"
    want = [plain.generate(p, params, chat=True).token_ids for p in SMOL_PROMPTS]
    for config in (dict(drafter="ngram"), dict(drafter="draft", tree_width=2, num_speculative_tokens=3, adaptive=False)):
        engine = Engine.from_pretrained(target=smol_path, dtype=dtype, linear_kernel="specdec", **config)
        outs = [engine.generate(p, params, chat=True) for p in SMOL_PROMPTS]
        assert [o.token_ids for o in outs] == want, config
        assert sum(o.stats.num_accepted_tokens for o in outs) > 0  # verify forwards over many rows ran


@needs_kernel
def test_sampled_tokens_follow_target_distribution(tiny_target, tiny_noisy_draft, one_thread):
    prompt, draws = [3, 1, 4, 1, 5, 9, 2, 6], 1500
    params = SamplingParams(temperature=1.0, top_k=20)
    engine = Engine.from_pretrained(target=tiny_target, drafter="draft", draft=tiny_noisy_draft, adaptive=False,
                                    num_speculative_tokens=3, linear_kernel="specdec")
    assert engine.runner.linear_kernel.kernel == "specdec"
    counts: dict = {}
    accepted = 0
    for seed in range(draws):
        out = engine.generate(prompt, SamplingParams(temperature=1.0, top_k=20, seed=seed, max_new_tokens=4,
                                                     ignore_eos=True))
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += out.stats.num_accepted_tokens
    assert accepted > draws // 2
    kl, tolerance = g_test_kl(counts, exact_joint(target_next_probs(tiny_target, params), prompt), draws)
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f}"


@needs_kernel
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_fused_rmsnorm_matches_transformers_and_rows_are_invariant(tiny_target, dtype):
    from specdec.kernels.linear import FusedRMSNorm

    model = load_model(tiny_target, dtype).model
    install(model, "specdec")
    norm = model.model.norm
    assert isinstance(norm, FusedRMSNorm)
    x = torch.randn(6, model.config.hidden_size).to(dtype)
    torch.testing.assert_close(norm(x), norm.original(x), rtol=1e-5 if dtype == torch.float32 else 1e-2, atol=1e-5)
    assert torch.equal(norm(x)[4:5], norm(x[4:5]))
    install(model, "torch")
    assert type(model.model.norm).__name__ == "LlamaRMSNorm"
