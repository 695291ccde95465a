"""The GPU check's exactness of the drafters that need the embedded target's shapes: suffix decoding,
the shipped Medusa, EAGLE and EAGLE-3 heads, and the hybrid (suffix + Medusa). A GPU machine cannot
receive the embedded model, so the target here is SmolLM2-135M's architecture with random weights (a
large initializer range gives clear logit margins, as in gpu_checks): the heads load (their shapes
match), draft, and are mostly rejected, which is what exactness needs: every verify path of these
drafters runs, and the tokens must equal plain decoding's.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.bench.gpu_checks import PROMPTS, equality_row, plain_tokens
from specdec.core.types import SamplingParams


@dataclass(frozen=True)
class HeadSizes:
    """How much of the check to run: the GPU's, or a few tokens for a CPU run of the same code."""

    num_prompts: int = len(PROMPTS)
    max_new_tokens: int = 48


TINY_HEADS = HeadSizes(num_prompts=1, max_new_tokens=8)


def save_smol_shaped(out: Path, seed: int = 4) -> Path:
    """SmolLM2-135M's architecture (30 layers, hidden 576, 9 heads over 3 kv heads, vocabulary 49,152,
    tied embeddings) with random weights, saved as a checkpoint."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    config = LlamaConfig(vocab_size=49152, hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                         num_attention_heads=9, num_key_value_heads=3, head_dim=64, max_position_embeddings=8192,
                         rope_theta=100000.0, rms_norm_eps=1e-5, tie_word_embeddings=True, initializer_range=0.5,
                         bos_token_id=None, eos_token_id=None, pad_token_id=None)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        LlamaForCausalLM(config).save_pretrained(out)
    return out


def drafters(checkpoints: Path) -> dict[str, dict]:
    """name -> Engine options: every drafter that reads the embedded target's shapes."""
    return {"suffix": dict(drafter="suffix"),
            "medusa": dict(drafter="medusa", draft=str(checkpoints / "medusa")),
            "hybrid (suffix + medusa)": dict(drafter="hybrid", draft=str(checkpoints / "medusa")),
            "eagle": dict(drafter="eagle", draft=str(checkpoints / "eagle")),
            "eagle3": dict(drafter="eagle3", draft=str(checkpoints / "eagle3"))}


def equality_heads(root: Path, device: str, graphs: bool, sizes: HeadSizes) -> list[dict]:
    """Greedy tokens of each drafter (graphs on or off) against plain eager decoding, prompt by prompt."""
    from specdec.drafters.trained import checkpoints_dir
    from specdec.engine import Engine

    target = str(save_smol_shaped(root / "smol-shaped"))
    prompts = PROMPTS[:sizes.num_prompts]
    params = SamplingParams(max_new_tokens=sizes.max_new_tokens, ignore_eos=True)
    want = plain_tokens(target, device, prompts, params)
    rows = []
    for name, options in drafters(checkpoints_dir()).items():
        engine = Engine.from_pretrained(target=target, device=device, dtype="float32", adaptive=False,
                                        cuda_graphs=graphs, num_speculative_tokens=4, **options)
        rows.append(equality_row("in process, SmolLM2-shaped", name, graphs, engine,
                                 [engine.generate(p, params) for p in prompts], want))
        del engine
    return rows
