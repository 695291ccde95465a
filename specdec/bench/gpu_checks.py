"""The checks benchmarks/gpu_check.py runs: exactness on the device (in process and over gRPC), a
G-test of sampled output, and the verify cost curve of an 8B-shaped model. Every model is built from
a transformers config with random weights (a GPU machine may have no network and no room for the
embedded model); a large initializer range gives logits clear margins, so greedy equality is not
decided by rounding.
"""
from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.core.types import SamplingParams


@dataclass(frozen=True)
class Sizes:
    """Model and sweep sizes: the GPU's, or tiny ones for a CPU run of the same code."""

    hidden: int = 256
    layers: int = 4
    vocab: int = 1024
    max_new_tokens: int = 48
    g_test_draws: int = 1000
    cost_rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64)
    cost_batches: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    cost_cached: int = 512
    cost_model: str = "8b"  # "8b": Llama-3-8B's shapes in bf16; "tiny": the equality model's in float32


TINY = Sizes(hidden=64, layers=2, vocab=96, max_new_tokens=16, g_test_draws=300, cost_rows=(1, 2, 4),
             cost_batches=(1, 2), cost_cached=32, cost_model="tiny")
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8], [11, 12, 13, 11, 12, 13, 11, 12], [40, 41, 42, 43], [3, 1, 4, 1, 5, 9, 2, 6]]


def save_llama(out: Path, sizes: Sizes, seed: int, hidden: int | None = None, layers: int | None = None,
               noise_of: Path | None = None) -> Path:
    """A random Llama checkpoint (or, with noise_of, that checkpoint plus 5% Gaussian weight noise:
    a draft that agrees with its target often but not always)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if noise_of is not None:
            model = LlamaForCausalLM.from_pretrained(noise_of, dtype=torch.float32)
            with torch.no_grad():
                for param in model.parameters():
                    param.add_(torch.randn_like(param) * 0.05 * param.std())
        else:
            hidden = hidden or sizes.hidden
            config = LlamaConfig(vocab_size=sizes.vocab, hidden_size=hidden, intermediate_size=2 * hidden,
                                 num_hidden_layers=layers or sizes.layers, num_attention_heads=4,
                                 num_key_value_heads=2, max_position_embeddings=2048, initializer_range=0.5,
                                 bos_token_id=None, eos_token_id=None, pad_token_id=None)
            model = LlamaForCausalLM(config)
    model.save_pretrained(out)
    return out


def build_models(root: Path, sizes: Sizes) -> dict[str, Path]:
    target = save_llama(root / "target", sizes, seed=1)
    return {"target": target,
            "random_draft": save_llama(root / "random-draft", sizes, seed=2, hidden=max(32, sizes.hidden // 4), layers=1),
            "noisy_draft": save_llama(root / "noisy-draft", sizes, seed=3, noise_of=target)}


# name -> (Engine options, the draft checkpoint among build_models' outputs); the noisy draft accepts
# often, so the accept-and-commit path is exercised too (the random one accepts almost nothing)
DRAFTERS = {"prompt lookup": (dict(drafter="ngram", num_branches=2), None),
            "random draft model": (dict(drafter="draft"), "random_draft"),
            "noisy draft model, trees": (dict(drafter="draft", tree_width=2), "noisy_draft")}


def plain_tokens(target: str, device: str, prompts: list, params: SamplingParams) -> list[list[int]]:
    """What every check compares with: plain eager decoding's greedy tokens, prompt by prompt."""
    from specdec.engine import Engine

    plain = Engine.from_pretrained(target=target, device=device, dtype="float32", adaptive=False, cuda_graphs=False)
    return [plain.generate(p, params).token_ids for p in prompts]


def equality_row(path: str, name: str, graphs: bool, engine, outs: list, want: list) -> dict:
    """One in-process check's row: did `outs` (engine.generate's, prompt by prompt) equal `want`."""
    graph_state = engine.runner.graphs
    return {"path": path, "drafter": name, "cuda_graphs": graphs,
            "graphs_active": bool(graph_state and graph_state.active),
            "graphs_off_reason": graph_state.reason if graph_state else None,
            "identical": [o.token_ids for o in outs] == want,
            "accepted": sum(o.stats.num_accepted_tokens for o in outs),
            "drafted": sum(o.stats.num_draft_tokens for o in outs)}


def equality_in_process(models: dict[str, Path], device: str, graphs: bool, sizes: Sizes) -> list[dict]:
    """Greedy tokens of each drafter (graphs on or off) against plain eager decoding, prompt by prompt."""
    from specdec.batch import generate_batch
    from specdec.engine import Engine

    params = SamplingParams(max_new_tokens=sizes.max_new_tokens, ignore_eos=True)
    want = plain_tokens(str(models["target"]), device, PROMPTS, params)
    rows = []
    for name, (options, draft_key) in {"plain": (dict(drafter="none"), None), **DRAFTERS}.items():
        draft = str(models[draft_key]) if draft_key else None
        engine = Engine.from_pretrained(target=str(models["target"]), draft=draft, device=device, dtype="float32",
                                        adaptive=False, cuda_graphs=graphs, num_speculative_tokens=4, **options)
        outs = [engine.generate(p, params) for p in PROMPTS]
        batched = generate_batch(engine, PROMPTS, params, max_batch=len(PROMPTS))
        rows.append({**equality_row("in process", name, graphs, engine, outs, want), "batched_identical": batched == want})
    return rows


def equality_grpc(models: dict[str, Path], device: str, graphs: bool, sizes: Sizes) -> list[dict]:
    """The same prompts through router + target worker + draft worker on 127.0.0.1."""
    from specdec.client import Client
    from specdec.launch import start_stack
    from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig

    params = SamplingParams(max_new_tokens=sizes.max_new_tokens, ignore_eos=True)
    want = plain_tokens(str(models["target"]), device, PROMPTS, params)
    rows = []
    for name, drafter in (("prompt lookup", "ngram"), ("random draft model", "draft")):
        config = StackConfig(
            router=RouterConfig(http_port=-1),
            targets=(TargetConfig(model=str(models["target"]), device=device, dtype="float32", cuda_graphs=graphs,
                                  num_threads=1),),
            drafts=(DraftConfig(drafter=drafter, model=str(models["random_draft"]) if drafter == "draft" else None,
                                target_model=str(models["target"]), device=device, dtype="float32", num_threads=1),),
            ready_timeout_s=180.0)
        start = time.perf_counter()
        stack = start_stack(config, env={"OMP_NUM_THREADS": "1", "PYTHONPATH": _absolute_pythonpath()})
        try:
            with Client(stack.address) as client:
                outs = [client.generate(p, params, timeout_s=120.0) for p in PROMPTS]
                info = client.server_info()
        finally:
            stack.stop()
        target = info.targets[0].info
        rows.append({"path": "gRPC", "drafter": name, "cuda_graphs": graphs,
                     "identical": [o.token_ids for o in outs] == want,
                     "accepted": sum(o.stats.num_accepted_tokens for o in outs),
                     "drafted": sum(o.stats.num_draft_tokens for o in outs),
                     "target_device": target.device, "kv_capacity_tokens": target.kv_capacity_tokens,
                     "kv_capacity_source": target.kv_capacity_source, "seconds": round(time.perf_counter() - start, 1)})
    return rows


def _absolute_pythonpath() -> str:
    """This process's PYTHONPATH made absolute, plus the source tree: what the workers must import (on a
    GPU machine the vendored wheels' --target directory, given relative to where the check started)."""
    import os

    paths = [str(Path(p).resolve()) for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    return os.pathsep.join([*paths, str(Path(__file__).resolve().parents[2])])


def g_test(models: dict[str, Path], device: str, sizes: Sizes) -> dict:
    """First two sampled tokens (a draft model drafting chains of 3) against the target's exact joint."""
    from specdec.bench.distribution import exact_joint, g_test_kl
    from specdec.core.sampling import warp
    from specdec.engine import Engine

    warp_params = SamplingParams(temperature=1.0, top_k=8)
    engine = Engine.from_pretrained(target=str(models["target"]), drafter="draft", draft=str(models["noisy_draft"]),
                                    device=device, dtype="float32", adaptive=False, num_speculative_tokens=3)
    model, prompt = engine.target.model, PROMPTS[3]

    @torch.inference_mode()
    def next_probs(ids: list[int]) -> torch.Tensor:
        return warp(model(input_ids=torch.tensor([ids], device=engine.runner.device)).logits[0, -1], warp_params)

    exact = exact_joint(next_probs, prompt)
    counts: dict = {}
    accepted = drafted = 0
    for seed in range(sizes.g_test_draws):
        out = engine.generate(prompt, SamplingParams(temperature=1.0, top_k=8, seed=seed, max_new_tokens=3,
                                                     ignore_eos=True))
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += out.stats.num_accepted_tokens
        drafted += out.stats.num_draft_tokens
    kl, tolerance = g_test_kl(counts, exact, sizes.g_test_draws)
    return {"draws": sizes.g_test_draws, "outcomes": len(exact), "kl": kl, "tolerance": tolerance,
            "passed": kl <= tolerance, "accepted": accepted, "drafted": drafted}
