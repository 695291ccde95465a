"""dtype="auto" on a CPU: a checkpoint's own bfloat16 where the CPU multiplies it natively and every product is
row-invariant, float32 otherwise, the choice and its reason logged once; exact either way (greedy equality
with plain decoding, and a G-test of sampling, in the dtype auto picked)."""
from __future__ import annotations

import logging
import os

import pytest
import torch

from distribution import exact_joint, g_test_kl, target_next_probs
from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.kernels.build import load_kernel
from specdec.models.loader import cpu_auto_dtype, pick_dtype

pytestmark = pytest.mark.usefixtures("one_thread")
NATIVE = load_kernel().native_bf16
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 43, 1, 2, 40, 41], [11, 12, 13]]
GREEDY = SamplingParams(max_new_tokens=32, ignore_eos=True)


@pytest.fixture(scope="module")
def bf16_target(tiny_target, tmp_path_factory):
    """The tiny target stored in bfloat16 (its config says so, as a bf16 checkpoint's does)."""
    from transformers import LlamaForCausalLM

    out = tmp_path_factory.mktemp("tiny-bf16") / "m"
    LlamaForCausalLM.from_pretrained(tiny_target, dtype=torch.bfloat16).save_pretrained(out)
    return str(out)


def auto_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.getMessage().startswith("dtype auto:")]


def test_a_float32_checkpoint_stays_float32_said_once_with_the_reason(tiny_target, caplog):
    cpu_auto_dtype.cache_clear()
    with caplog.at_level(logging.INFO, logger="specdec.models.loader"):
        picked = [pick_dtype("auto", torch.device("cpu"), target=tiny_target) for _ in range(3)]
    assert picked == [torch.float32] * 3
    [line] = auto_lines(caplog)
    assert "float32" in line and "stored in float32: bf16 would round its weights" in line


def test_a_bf16_checkpoint_runs_in_bf16_where_the_cpu_multiplies_it_natively(bf16_target, caplog):
    cpu_auto_dtype.cache_clear()
    with caplog.at_level(logging.INFO, logger="specdec.models.loader"):
        picked = pick_dtype("auto", torch.device("cpu"), target=bf16_target)
    [line] = auto_lines(caplog)
    if NATIVE:
        assert picked == torch.bfloat16
        assert "bfloat16" in line and ("AMX" in line or "AVX512-BF16" in line)
    else:
        assert picked == torch.float32
        assert "no native bfloat16 here" in line


@pytest.mark.parametrize("how, why", [
    (dict(linear_kernel="torch"), "would run on torch's kernels (asked for)"),
    (dict(tp_degree=2), "would run on torch's kernels (tensor-parallel"),
    (dict(kv_cache="dynamic"), "kv_cache dynamic"),
])
def test_bf16_only_where_every_product_is_row_invariant(bf16_target, caplog, how, why):
    cpu_auto_dtype.cache_clear()
    with caplog.at_level(logging.INFO, logger="specdec.models.loader"):
        assert pick_dtype("auto", torch.device("cpu"), target=bf16_target, **how) == torch.float32
    [line] = auto_lines(caplog)
    assert (why if NATIVE else "no native bfloat16 here") in line


def test_an_explicit_dtype_is_kept(bf16_target, tiny_target):
    assert pick_dtype("float32", torch.device("cpu"), target=bf16_target) == torch.float32
    assert pick_dtype("bfloat16", torch.device("cpu"), target=tiny_target) == torch.bfloat16


@pytest.fixture(scope="module")
def auto_reference(bf16_target):
    engine = Engine.from_pretrained(target=bf16_target)
    assert engine.runner.dtype == (torch.bfloat16 if NATIVE else torch.float32)
    return [engine.generate(p, GREEDY).token_ids for p in PROMPTS]


@pytest.mark.parametrize("config", [dict(drafter="ngram"), dict(drafter="suffix"),
                                    dict(drafter="draft", tree_width=2, num_speculative_tokens=4)],
                         ids=lambda c: c["drafter"])
def test_greedy_equals_plain_decoding_in_the_dtype_auto_picked(bf16_target, tiny_draft, auto_reference, config):
    engine = Engine.from_pretrained(target=bf16_target, draft=tiny_draft if config["drafter"] == "draft" else None,
                                    **config)
    assert engine.runner.dtype == (torch.bfloat16 if NATIVE else torch.float32)
    for prompt, want in zip(PROMPTS, auto_reference):
        assert engine.generate(prompt, GREEDY).token_ids == want
    batch = generate_batch(engine, PROMPTS, GREEDY)  # several sequences a verify: still each one's plain decode
    assert batch == auto_reference


@pytest.mark.skipif(not NATIVE, reason="auto keeps float32 here: the float32 G-tests cover it")
def test_sampling_follows_the_bf16_target(bf16_target, tiny_noisy_draft):
    """The bf16 target's exact joint of two tokens, from its own row-invariant kernels (the same numerics
    plain decoding has), against what speculative sampling with a draft model emits."""
    params = SamplingParams(temperature=1.0, top_k=20)
    engine = Engine.from_pretrained(target=bf16_target, drafter="draft", draft=tiny_noisy_draft, adaptive=False,
                                    num_speculative_tokens=3)
    prompt, num_draws, counts, accepted = [3, 1, 4, 1, 5, 9, 2, 6], 2000, {}, 0
    for seed in range(num_draws):
        out = engine.generate(prompt, SamplingParams(temperature=1.0, top_k=20, seed=seed, max_new_tokens=4,
                                                     ignore_eos=True))
        counts[tuple(out.token_ids[:2])] = counts.get(tuple(out.token_ids[:2]), 0) + 1
        accepted += out.stats.num_accepted_tokens
    assert accepted > num_draws // 2  # drafts were really accepted (and the G-test sees the rejections' residuals)
    exact = exact_joint(target_next_probs(bf16_target, params, torch.bfloat16), prompt)
    kl, tolerance = g_test_kl(counts, exact, num_draws)
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f}"


def test_the_cli_says_what_auto_picked_at_log_level_info(smol_path, caplog, monkeypatch, capsys):
    from specdec.cli import LOG_LEVEL_ENV, main

    monkeypatch.setenv(LOG_LEVEL_ENV, "warning")  # restored afterwards: main sets it for the servers it starts
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", root.level)
    cpu_auto_dtype.cache_clear()
    root.setLevel(logging.WARNING)
    assert main(["--log-level", "info", "generate", "--target", smol_path, "--max-new-tokens", "2", "Hi"]) == 0
    assert root.level == logging.INFO  # what lets the line through: main set it
    assert any(line.startswith("dtype auto: float32") and "stored in float32" in line for line in auto_lines(caplog))
    assert os.environ[LOG_LEVEL_ENV] == "info"
