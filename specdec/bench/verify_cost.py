"""Milliseconds of one verify forward against rows per sequence and batch size, eager or graphed.

A forward of `rows` new tokens for each of `batch` sequences over a static cache of `cached` entries,
with its LM head over every row (verification reads all of them): what a verify step costs the
target, without drafting or the tree walk. The cache is trimmed back after each forward, so every
repeat measures the same shape. Graphed (specdec.graphs) includes the padding and the copies in and
out of the graph's buffers, as the serving path pays them.
"""
from __future__ import annotations

import time

import torch

from specdec.graphs import GraphedDecoder


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.inference_mode()
def verify_forward_ms(runner, batch: int, rows: int, cached: int, graphs: GraphedDecoder | None = None,
                      repeats: int = 10, warmup: int = 2) -> float:
    """Mean milliseconds of `repeats` forwards after `warmup` of them (graphed: the first one captures)."""
    device, config = runner.device, runner.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    cache = runner.new_cache(cached + rows)
    cache.adopt(torch.randn(config.num_hidden_layers, 2, batch, heads, cached + rows, head_dim,
                            dtype=runner.dtype, device=device), cached)
    ids = torch.randint(0, runner.vocab_size, (batch, rows), device=device)
    positions = (cached + torch.arange(rows, device=device)).expand(batch, rows)
    bias = torch.zeros(batch, 1, rows, cached + rows, dtype=runner.dtype, device=device)
    bias[..., cached:] = torch.full((rows, rows), torch.finfo(runner.dtype).min, device=device).triu(1)  # a chain
    forward = graphs.forward_batch if graphs is not None else runner.eager_forward_batch

    def step() -> None:
        hidden = forward(ids, cache, bias, positions)
        runner.logits(hidden.reshape(-1, hidden.shape[-1]))
        cache.trim(cached)

    for _ in range(warmup):
        step()
    synchronize(device)
    start = time.perf_counter()
    for _ in range(repeats):
        step()
    synchronize(device)
    return 1000 * (time.perf_counter() - start) / repeats
