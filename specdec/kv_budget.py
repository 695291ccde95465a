"""How many KV cache tokens a target worker may hold: from the GPU's real memory, or as configured.

On a GPU the budget is what the worker's share of the device leaves after everything else (vLLM's
`gpu_memory_utilization`, here `--gpu-memory-fraction`):

    budget_bytes = total * gpu_memory_fraction - in_use_after_loading - activation_peak - prefix_cache
    capacity     = budget_bytes // bytes_per_token
    bytes_per_token = 2 (keys, values) * layers * kv_heads_per_rank * head_dim * dtype bytes

`in_use_after_loading` is the device's total minus its free memory once the weights are in (so it
counts the CUDA context and any other process on the GPU too); `activation_peak` is measured by one
forward of the largest batch a step may run (max_batch sequences of MAX_VERIFY_ROWS rows, plus their
logits); `prefix_cache` is the prompt-prefix cache's most bytes (`--prefix-cache-mb`), which fills
after the budget is planned. The router plans admission with the capacity the target reports (GetWorkerInfo, summed in
GetServerInfo). On a CPU nothing changes: `--max-kv-tokens`, or room for every sequence slot at the
model's full context.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidArgument


@dataclass(frozen=True)
class KvBudget:
    capacity_tokens: int
    source: str  # "gpu_memory" | "max_kv_tokens" | "context" (max_sequences x the model's context)
    bytes_per_token: int = 0  # 0 where not computed


def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, tp_degree: int = 1) -> int:
    """KV bytes one cached token takes on one rank: keys and values of every layer, this rank's heads."""
    return 2 * num_layers * (num_kv_heads // tp_degree) * head_dim * dtype_bytes


def gpu_kv_tokens(total_bytes: int, in_use_bytes: int, activation_bytes: int, fraction: float,
                  token_bytes: int) -> int:
    """Tokens the KV cache may hold on a GPU; refuses (one line) a fraction that leaves no room.
    activation_bytes: a step's activations plus what else is set aside (the prompt-prefix cache)."""
    budget = int(total_bytes * fraction) - in_use_bytes - activation_bytes
    tokens = budget // token_bytes if token_bytes > 0 else 0
    if tokens <= 0:
        gib = 2 ** 30
        raise InvalidArgument(f"--gpu-memory-fraction {fraction} of {total_bytes / gib:.1f} GiB leaves no room for a "
                              f"KV cache: {in_use_bytes / gib:.2f} GiB in use after loading and "
                              f"{activation_bytes / gib:.2f} GiB for a step's activations and the prefix cache; raise it "
                              f"or lower --max-batch or --prefix-cache-mb")
    return tokens


def plan(engine, max_sequences: int, max_kv_tokens: int, max_batch: int, gpu_memory_fraction: float,
         tp_degree: int = 1) -> KvBudget:
    """The target worker's budget. Under tensor parallelism every rank calls this (the profiling
    forward is a collective there) and rank 0's figure is the one served."""
    config = engine.runner.config
    heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    token_bytes = bytes_per_token(config.num_hidden_layers, heads, head_dim, engine.runner.dtype.itemsize, tp_degree)
    if max_kv_tokens > 0:
        return KvBudget(max_kv_tokens, "max_kv_tokens", token_bytes)
    if engine.runner.device.type != "cuda":
        return KvBudget(max_sequences * engine.max_len, "context", token_bytes)
    import torch

    device = engine.runner.device
    prefixes = engine.runner.prefix_cache
    set_aside = activation_peak(engine.runner, max_batch) + (prefixes.max_bytes if prefixes is not None else 0)
    free, total = torch.cuda.mem_get_info(device)
    tokens = gpu_kv_tokens(total, total - free, set_aside, gpu_memory_fraction, token_bytes)
    return KvBudget(tokens, "gpu_memory", token_bytes)


def activation_peak(runner, max_batch: int) -> int:
    """Bytes one verify forward of max_batch x runner.max_rows rows allocates beyond what is already
    allocated (its KV entries included: a handful of tokens), measured on the device."""
    import torch

    device = runner.device
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    rows = runner.max_rows
    cache = runner.new_cache(rows + 1)
    ids = torch.zeros(max_batch, rows, dtype=torch.long, device=device)
    positions = torch.arange(rows, device=device).expand(max_batch, rows)
    bias = torch.zeros(max_batch, 1, rows, rows, dtype=runner.dtype, device=device)
    hidden = runner.forward_batch(ids, cache, bias, positions)
    runner.logits(hidden.reshape(-1, hidden.shape[-1]))
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    del cache, hidden
    torch.cuda.empty_cache()
    return peak
