"""Where a benchmark ran: CPU, cores, accelerator, library versions and the source commit.

Absolute timings mean nothing without this, and a table in the README must say which machine it
came from.
"""
from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

CPU_FLAGS = ("avx2", "avx512f", "avx512_bf16", "amx_bf16")


def cpu_info() -> dict:
    model, flags = platform.processor() or platform.machine(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and value.strip():
                model = value.strip()
            elif key.strip() == "flags":
                flags = set(value.split())
    except OSError:
        pass
    return {"cpu": model, "cpu_flags": [f for f in CPU_FLAGS if f in flags]}


def memory_gib() -> float | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    except (OSError, ValueError, IndexError):
        pass
    return None


def git_commit(repo: Path) -> str | None:
    """HEAD of the source tree, with '+dirty' when it has uncommitted changes (None outside git)."""
    try:
        head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(repo), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def machine_info() -> dict:
    import torch

    info = {"hostname": platform.node(), "os": platform.platform(), **cpu_info(), "num_cpus": os.cpu_count(),
            "torch_num_threads": torch.get_num_threads(), "memory_gib": memory_gib(),
            "accelerator": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        info["load_average_1m"] = round(os.getloadavg()[0], 2)
    except OSError:
        pass
    return info


def versions(repo: Path) -> dict:
    import torch
    import transformers

    import specdec

    return {"python": platform.python_version(), "torch": torch.__version__, "transformers": transformers.__version__,
            "specdec": getattr(specdec, "__version__", None) or _package_version(), "git_commit": git_commit(repo)}


def _package_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specdec")
    except PackageNotFoundError:
        return None
