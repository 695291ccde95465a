"""Where a model runs: the `device` option (auto | cpu | cuda | cuda:N), checked before any weight loads.

Everything a step makes (token ids, masks, positions, q, sampling generators, KV caches) is created
on the model's device; data crosses to the host only where it must leave (the tokens a step commits,
once per step, and the wire). `auto` is `cuda` when a GPU is visible, else `cpu`. Under tensor
parallelism each rank is one process with one GPU, `cuda:LOCAL_RANK`, and the ranks talk over NCCL;
on CPUs they talk over gloo (`specdec.parallel.backend_for`).

The checks here turn what would be a stack trace deep inside torch (no CUDA, too few GPUs for the TP
degree, a dtype the device cannot run) into one line naming what to change.
"""
from __future__ import annotations

import os

import torch

from specdec.core.types import check_device_name
from specdec.errors import InvalidArgument
from specdec.models.loader import pick_dtype


def num_visible_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def local_rank() -> int | None:
    """This process's rank on its machine under torchrun or `--tp N` (None outside a group)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return None
    return int(os.environ.get("LOCAL_RANK", os.environ.get("RANK", "0")))


def resolve_device(name: str = "auto", tp_degree: int = 1) -> torch.device:
    """The torch device for a `device` option. With ranks (tp_degree > 1 inside a group) a plain
    `cuda` means this rank's own GPU, cuda:LOCAL_RANK."""
    name = check_device_name(name)
    if name == "auto":
        name = "cuda" if num_visible_gpus() else "cpu"
    if name == "cpu":
        return torch.device("cpu")
    visible = num_visible_gpus()
    if visible == 0:
        raise InvalidArgument(f"device {name!r} asked for, but no CUDA device is visible (torch "
                              f"{torch.__version__}, CUDA {'built' if torch.version.cuda else 'not built'} in; "
                              f"CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES', 'unset')}); "
                              f"use --device cpu")
    if tp_degree > visible:
        raise InvalidArgument(f"--tp {tp_degree} on {name!r} needs {tp_degree} GPUs (one per rank), but "
                              f"{visible} {'is' if visible == 1 else 'are'} visible; use --tp {visible} or fewer, "
                              f"or --device cpu")
    if tp_degree > 1 and ":" in name:
        raise InvalidArgument(f"device {name!r} with --tp {tp_degree}: each rank uses its own GPU "
                              f"(rank r on cuda:r); pass --device cuda")
    index = int(name.split(":")[1]) if ":" in name else ((local_rank() or 0) if tp_degree > 1 else 0)
    if index >= visible:
        raise InvalidArgument(f"device {name!r} asked for, but only {visible} CUDA "
                              f"device{'s are' if visible > 1 else ' is'} visible (cuda:0..cuda:{visible - 1})")
    return torch.device("cuda", index)


def placement(device_name: str, dtype_name: str, tp_degree: int = 1, *, target: str | os.PathLike | None = None,
              linear_kernel: str = "auto", kv_cache: str = "static") -> tuple[torch.device, torch.dtype]:
    """(device, dtype) for a model's `device` and `dtype` options, every refusal before loading. target (None:
    the embedded default), linear_kernel and kv_cache: how the model will run, which `dtype="auto"` weighs."""
    device = resolve_device(device_name, tp_degree)
    dtype = pick_dtype(dtype_name, device, target=target, linear_kernel=linear_kernel, kv_cache=kv_cache,
                       tp_degree=tp_degree)
    check_dtype(device, dtype)
    return device, dtype


def check_dtype(device: torch.device, dtype: torch.dtype) -> None:
    """Refuse a dtype this device cannot compute in (before loading weights in it)."""
    if not supports_dtype(device, dtype):
        name = str(dtype).removeprefix("torch.")
        detail = (f"{torch.cuda.get_device_name(device)} (compute capability "
                  f"{'.'.join(map(str, torch.cuda.get_device_capability(device)))})" if device.type == "cuda"
                  else "this CPU")
        raise InvalidArgument(f"dtype {name} cannot run on {device} ({detail}); use --dtype float32"
                              + (" or float16" if device.type == "cuda" else ""))


def supports_dtype(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether the device runs the model's kernels (matmul, attention) in dtype."""
    if device.type == "cuda" and dtype == torch.bfloat16:
        return torch.cuda.is_bf16_supported(including_emulation=False)  # bf16 tensor cores: Ampere (8.0) on
    if device.type == "cpu" and dtype in (torch.bfloat16, torch.float16):
        return _cpu_runs(dtype)
    return True


def _cpu_runs(dtype: torch.dtype) -> bool:
    """A tiny matmul and attention in dtype: builds without the kernels raise instead of computing."""
    try:
        x = torch.ones(1, 1, 2, 8, dtype=dtype)
        torch.nn.functional.scaled_dot_product_attention(x, x, x)
        torch.nn.functional.linear(x[0, 0], torch.ones(4, 8, dtype=dtype))
        return True
    except RuntimeError:
        return False


def describe(device: torch.device) -> str:
    """One line for logs and reports: the device and, on a GPU, its name and memory."""
    if device.type != "cuda":
        return str(device)
    free, total = torch.cuda.mem_get_info(device)
    return f"{device} ({torch.cuda.get_device_name(device)}, {free / 2**30:.1f} of {total / 2**30:.1f} GiB free)"
