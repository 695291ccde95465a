"""Starting the processes of a tensor-parallel target worker, or joining a group someone else started.

`specdec serve target --tp N` becomes a small launcher: it checks the degree against the model (a
bad one is one line naming the valid degrees, before any rank starts), then runs the same command
as N ranks on 127.0.0.1 with RANK / WORLD_SIZE / MASTER_* set, and stays their parent. Under
torchrun those variables are already set and each process only joins (`join`). See tp.py for what
the ranks do once joined.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import torch

from specdec import parallel
from specdec.drafters import SELF_DRAFTERS
from specdec.errors import InvalidArgument
from specdec.config_fields import config_to_argv
from specdec.serving_config import TargetConfig

COLLECTIVE_TIMEOUT_S = 300.0  # longest any rank waits in one collective before giving up
GRACE_S = 15.0  # the launcher's wait for ranks to stop before it kills them


def check(config: TargetConfig) -> None:
    """Refuse a degree that does not split the heads (naming those that do), before any rank starts."""
    from transformers import AutoConfig

    from specdec.models.loader import resolve_path

    if config.tp > 1 and config.drafter in SELF_DRAFTERS:  # they read the unsplit LM head, which TP lacks
        raise InvalidArgument(f"--drafter {config.drafter} reads the target's whole LM head, which --tp "
                              f"{config.tp} splits; use --tp 1, or a draft worker / --drafter ngram or draft")
    parallel.check_tp_degree(AutoConfig.from_pretrained(resolve_path(config.model), local_files_only=True), config.tp)


def join(config: TargetConfig, device) -> int:
    """Join the group that a launcher or torchrun describes (RANK, WORLD_SIZE, ...); returns this rank.
    device: this rank's (cuda:LOCAL_RANK on GPUs: NCCL; the CPU: gloo)."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world != config.tp:
        raise InvalidArgument(f"--tp {config.tp} but WORLD_SIZE is {world}: pass --tp {world} "
                              f"(or start without torchrun and let --tp {config.tp} launch the ranks)")
    if world == 1:
        return 0
    check(config)
    parallel.init_from_env(timeout_s=COLLECTIVE_TIMEOUT_S, device=device)
    return torch.distributed.get_rank()


def launch(config: TargetConfig) -> int:
    """`serve target --tp N` outside torchrun: run this server as N ranks and stay their parent.

    Rank 0 keeps our stdout (its ready line is ours); the others' stdout would repeat it. SIGTERM and
    SIGINT go to rank 0, which drains and stops the followers; when any rank ends, all are stopped.
    """
    check(config)
    from specdec.device import placement
    from specdec.launch import PARENT_ENV  # ranks die with their parent (specdec.launch.die_with_parent)

    # too few GPUs: refused before any rank starts
    device, _ = placement(config.device, config.dtype, config.tp, target=config.model)

    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(parallel.free_port()), WORLD_SIZE=str(config.tp),
               **parallel.rank_env(device.type), **{PARENT_ENV: str(os.getpid())})
    cmd = [sys.executable, "-m", "specdec.cli", "serve", "target", *config_to_argv(config)]
    ranks: list[subprocess.Popen] = []
    try:
        for rank in range(config.tp):
            ranks.append(subprocess.Popen(cmd, env=dict(env, RANK=str(rank), LOCAL_RANK=str(rank)),
                                          stdout=None if rank == 0 else subprocess.DEVNULL))
        while not stop.wait(0.1) and all(p.poll() is None for p in ranks):
            pass
        if ranks[0].poll() is None:
            ranks[0].terminate()
        deadline = time.monotonic() + config.drain_timeout_s + GRACE_S  # rank 0 drains first
        for p in ranks:
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        codes = [p.returncode for p in ranks]
        return next((c if c > 0 else 1 for c in codes if c != 0), 0)
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()
