"""What a verify forward costs on the device, and where a decode step's time goes: the GPU check's
timing sections (benchmarks/gpu_check.py). The model is Llama-3-8B's shapes in bf16 with random
weights (or, for a CPU run of the same code, the tiny equality shapes): timings need no trained weights.
"""
from __future__ import annotations

import torch

from specdec.bench.gpu_checks import Sizes
from specdec.core.types import SamplingParams


def llama(device: str, sizes: Sizes) -> torch.nn.Module:
    """Llama-3-8B's shapes in bf16, or the tiny equality shapes in float32, random weights, on the device."""
    from transformers import AutoModelForCausalLM, LlamaConfig

    if sizes.cost_model == "8b":
        config = LlamaConfig(vocab_size=128256, hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                             num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=8192,
                             rope_theta=500000.0, tie_word_embeddings=False)
        dtype = torch.bfloat16
    else:
        config = LlamaConfig(vocab_size=sizes.vocab, hidden_size=sizes.hidden, intermediate_size=2 * sizes.hidden,
                             num_hidden_layers=sizes.layers, num_attention_heads=4, num_key_value_heads=2)
        dtype = torch.float32
    with torch.device(device):
        return AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa").eval().requires_grad_(False)


def cost_model(device: str, sizes: Sizes, attention: str | None = None):
    """A ModelRunner over llama(): attention None = the runner's own choice; "sdpa" = transformers' sdpa
    (the baseline to compare)."""
    from specdec.models.runner import ModelRunner, RunnerConfig

    runner = ModelRunner(llama(device, sizes), config=RunnerConfig(kv_cache="static"))
    if attention is not None:
        runner.model.config._attn_implementation = attention
    return runner


def cost_curve(device: str, sizes: Sizes, attention: str | None = None) -> dict:
    """ms of one verify forward per (batch, rows), eager and graphed (graphed: None where graphs are off)."""
    from specdec.bench.verify_cost import verify_forward_ms
    from specdec.graphs import GraphedDecoder

    runner = cost_model(device, sizes, attention)
    graphs = GraphedDecoder(runner)
    rows = []
    for batch in sizes.cost_batches:
        for n in sizes.cost_rows:
            eager = verify_forward_ms(runner, batch, n, sizes.cost_cached)
            graphed = verify_forward_ms(runner, batch, n, sizes.cost_cached, graphs) if graphs.active else None
            rows.append({"batch": batch, "rows": n, "eager_ms": round(eager, 3),
                         "graphs_ms": None if graphed is None else round(graphed, 3)})
    for row in rows:  # ratio to the one-row step of the same batch and mode
        one = next(r for r in rows if r["batch"] == row["batch"] and r["rows"] == 1)
        row["eager_ratio"] = round(row["eager_ms"] / one["eager_ms"], 3)
        row["graphs_ratio"] = None if row["graphs_ms"] is None else round(row["graphs_ms"] / one["graphs_ms"], 3)
    params = sum(p.numel() for p in runner.model.parameters())
    return {"model": sizes.cost_model, "parameters": params, "dtype": str(runner.dtype).removeprefix("torch."),
            "attention": runner.model.config._attn_implementation,
            "cached_tokens": sizes.cost_cached, "graphs_active": graphs.active, "graphs_off_reason": graphs.reason,
            "rows": rows}


def profile(device: str, sizes: Sizes, shapes=((1, 1), (8, 8), (32, 2)), top: int = 8) -> list[dict]:
    """Where a graphed verify forward's time goes: the costliest kernels per (batch, rows), from
    torch.profiler over 5 forwards (device microseconds per forward)."""
    from torch.profiler import ProfilerActivity, profile as torch_profile

    from specdec.bench.verify_cost import verify_forward_ms
    from specdec.graphs import GraphedDecoder

    runner = cost_model(device, sizes)
    graphs = GraphedDecoder(runner)
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.device(device).type == "cuda" else [])
    out = []
    for batch, rows in shapes:
        rows = min(rows, max(sizes.cost_rows))
        verify_forward_ms(runner, batch, rows, sizes.cost_cached, graphs, repeats=2)  # capture outside the profile
        with torch_profile(activities=activities) as prof:
            verify_forward_ms(runner, batch, rows, sizes.cost_cached, graphs, repeats=5, warmup=0)
        events = [e for e in prof.key_averages() if _device_us(e) > 0]
        events.sort(key=_device_us, reverse=True)
        out.append({"batch": batch, "rows": rows, "device_us_per_forward": round(sum(map(_device_us, events)) / 5, 1),
                    "kernels": [{"name": e.key[:90], "us_per_forward": round(_device_us(e) / 5, 1),
                                 "calls_per_forward": e.count / 5} for e in events[:top]]})
    return out


def decode(device: str, sizes: Sizes, new_tokens: int = 64, runs: int = 3) -> list[dict]:
    """End to end on the same model: plain decoding and prompt lookup (every step drafts where the text
    repeats), CUDA graphs by default. ms per target forward against the graphed forward alone (the cost
    section's) shows what a step costs beyond its forward: Python, masks, the walk, host copies."""
    from pathlib import Path

    from specdec.drafters import build_drafter
    from specdec.engine import Engine, EngineConfig
    from specdec.models.loader import LoadedModel
    from specdec.models.runner import RunnerConfig

    loaded = LoadedModel(llama(device, sizes), None, Path("random-" + sizes.cost_model))
    vocab = loaded.model.config.vocab_size
    prompt = [(7 * i) % vocab for i in range(1, 33)] * 4  # a block said four times: prompt lookup drafts it
    params = SamplingParams(max_new_tokens=new_tokens, ignore_eos=True)
    out = []
    for name in ("none", "ngram"):
        config = EngineConfig(adaptive=False, num_speculative_tokens=4, runner=RunnerConfig(cuda_graphs=None))
        engine = Engine(loaded, build_drafter(name, loaded, None, {}, loaded.model.dtype), config)
        engine.generate(prompt, params)  # captures this run's graphs
        graphs = engine.runner.graphs
        captured = graphs.num_captures if graphs else 0
        stats = [engine.generate(prompt, params).stats for _ in range(runs)]
        forwards = sum(s.num_target_forwards for s in stats)
        decode_s = sum(s.elapsed_s - s.prefill_s for s in stats)
        out.append({"drafter": name, "graphs": bool(graphs and graphs.active),
                    "captures_timed": (graphs.num_captures if graphs else 0) - captured,
                    "tokens_per_s": round(sum(s.num_new_tokens for s in stats) / sum(s.elapsed_s for s in stats), 1),
                    "ms_per_forward": round(1000 * decode_s / forwards, 3),
                    "verify_ms_per_forward": round(1000 * sum(s.verify_s for s in stats) / forwards, 3),
                    "draft_ms_per_forward": round(1000 * sum(s.draft_s for s in stats) / forwards, 3),
                    "rows_per_forward": round(1 + sum(s.num_draft_tokens for s in stats) / forwards, 2),
                    "tau": round(sum(s.num_new_tokens for s in stats) / forwards, 3)})
        del engine
    return out


def _device_us(event) -> float:
    """An event's own device time (the attribute's name moved between torch versions); 0 on a CPU."""
    for name in ("self_device_time_total", "self_cuda_time_total"):
        if hasattr(event, name):
            return float(getattr(event, name))
    return 0.0
