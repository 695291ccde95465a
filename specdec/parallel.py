"""Tensor parallelism for the in-process engine: N processes over torch.distributed (NCCL when the
ranks are on GPUs, one process per GPU; gloo on CPUs: `backend_for`).

transformers splits the target itself (`tp_plan="auto"`: attention heads and MLP columns per rank,
an all-reduce per layer, a gathered LM head). Every rank runs the same engine loop on the same
inputs; the only decisions that could differ between ranks are taken once on rank 0 and broadcast:
how many tokens to draft and how many nodes of a scored tree to verify (both timing-based) and, for
unseeded sampling, the seed. Drafters run
replicated (they are small), so every rank verifies the same tree and commits the same tokens.
"""
from __future__ import annotations

import datetime
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import torch

from specdec.errors import InvalidArgument


def valid_tp_degrees(num_heads: int, num_kv_heads: int, max_degree: int = 64) -> list[int]:
    return [d for d in range(1, max_degree + 1) if num_heads % d == 0 and num_kv_heads % d == 0]


def check_tp_degree(config, degree: int) -> None:
    """Refuse a degree that does not split the attention heads evenly, naming the ones that do."""
    heads = config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    if degree < 1 or heads % degree or kv_heads % degree:
        valid = ", ".join(map(str, valid_tp_degrees(heads, kv_heads)))
        raise InvalidArgument(f"--tp {degree} does not divide the model's {heads} attention heads and "
                              f"{kv_heads} key-value heads; valid degrees: {valid}")


def world_size() -> int:
    return torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1


def backend_for(device: torch.device) -> str:
    """NCCL between GPUs (one process per GPU), gloo between CPU processes."""
    return "nccl" if torch.device(device).type == "cuda" else "gloo"


def rank_env(device_name: str) -> dict[str, str]:
    """Environment a launcher gives its ranks beyond RANK / WORLD_SIZE / MASTER_*: ranks asked to run
    on the CPU see no GPU, so transformers' tensor-parallel loading (which places shards on whatever
    accelerator the process sees) keeps them on the CPU too."""
    return {"CUDA_VISIBLE_DEVICES": ""} if device_name == "cpu" else {}


def init_from_env(timeout_s: float | None = None, device: torch.device | str = "cpu") -> int:
    """Join the process group described by RANK / WORLD_SIZE / MASTER_* (set by `launch`); returns world size.

    device: this rank's device (specdec.device.resolve_device); it decides the backend, and a GPU
    rank binds to its GPU first. timeout_s bounds every collective (torch's default is 30 min): a
    server's ranks must notice a hung peer sooner, and never wait that long idle.
    """
    if "WORLD_SIZE" not in os.environ or int(os.environ["WORLD_SIZE"]) <= 1:
        return 1
    device = torch.device(device)
    if not torch.distributed.is_initialized():
        options = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
        if device.type == "cuda":
            torch.cuda.set_device(device)
            options["device_id"] = device
        torch.distributed.init_process_group(backend_for(device), rank=int(os.environ["RANK"]),
                                             world_size=int(os.environ["WORLD_SIZE"]), **options)
    if device.type == "cpu":
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world_size()))
    return world_size()


def group_device() -> torch.device:
    """Where collectives' tensors must live: this rank's GPU under NCCL, else the CPU."""
    if torch.distributed.is_initialized() and torch.distributed.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def broadcast_int(value: int) -> int:
    """Rank 0's value on every rank (identity outside a process group)."""
    if world_size() == 1:
        return value
    buf = torch.tensor([value], dtype=torch.long, device=group_device())
    torch.distributed.broadcast(buf, src=0)
    return int(buf)


def is_rank0() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(argv: list[str], degree: int, timeout_s: float = 3600.0, device_name: str = "auto") -> int:
    """Run `python -m specdec.cli ARGV` as `degree` ranks on 127.0.0.1; rank 0 owns stdout.

    Other ranks' stdout is discarded (it would repeat rank 0's); their stderr passes through so a
    failure on any rank is visible. If one rank fails, the others are stopped.
    """
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(degree),
               **rank_env(device_name))
    cmd = [sys.executable, "-m", "specdec.cli", *argv]
    procs = []
    try:
        for rank in range(degree):
            env_of_rank = dict(env, RANK=str(rank), LOCAL_RANK=str(rank))
            procs.append(subprocess.Popen(cmd, env=env_of_rank, cwd=Path.cwd(),
                                          stdout=None if rank == 0 else subprocess.DEVNULL))
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            codes = [p.poll() for p in procs]
            failed = next((c for c in codes if c not in (None, 0)), None)
            if failed is not None:  # a dead rank would leave the others blocked in a collective
                return failed
            if all(c == 0 for c in codes):
                return 0
            time.sleep(0.05)
        print(f"specdec: error: tensor-parallel run exceeded {timeout_s:.0f} s", file=sys.stderr)
        return 1
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(timeout=10)
