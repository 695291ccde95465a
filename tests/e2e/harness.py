"""Starting real server processes for a test and always stopping them (try/finally, bounded waits)."""
from __future__ import annotations

import contextlib
import dataclasses
import time

from specdec.launch import spawn, start_stack, wait_ready
from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig

READY_TIMEOUT_S = 120.0
ENV = {"OMP_NUM_THREADS": "1"}  # 2 shared cores: one torch thread per process keeps them from thrashing


def stack_config(models, drafter: str = "draft", pipeline: bool = True, **target_overrides) -> StackConfig:
    target = models["target"]
    return StackConfig(
        router=RouterConfig(max_active=8, max_queue=8),
        targets=(TargetConfig(model=str(target), dtype="float32", num_threads=1, **target_overrides),),
        drafts=(DraftConfig(drafter=drafter, model=str(models["draft"]) if drafter == "draft" else None,
                            target_model=str(target), dtype="float32", num_threads=1, pipeline=pipeline),),
        ready_timeout_s=READY_TIMEOUT_S)


def always_drafting(config: StackConfig, num_speculative_tokens: int = 2) -> StackConfig:
    """The same stack drafting num_speculative_tokens at every step: no adaptive or load-aware choice.

    On the tiny target a forward costs less than a draft's round trip, so the adaptive stack rightly
    stops drafting; tests of what drafts do (their figures, their timing) need them every step."""
    targets = tuple(dataclasses.replace(t, adaptive=False, load_aware=False) for t in config.targets)
    drafts = tuple(dataclasses.replace(d, adaptive=False, num_speculative_tokens=num_speculative_tokens)
                   for d in config.drafts)
    return dataclasses.replace(config, targets=targets, drafts=drafts)


@contextlib.contextmanager
def running_stack(config: StackConfig, env: dict | None = None, supervise: bool = False):
    """env: extra environment variables of every process (OTEL_* for the tracing tests); supervise:
    restart processes that die, as `specdec serve` does."""
    stack = start_stack(config, env={**ENV, **(env or {})}, supervise=supervise)
    try:
        yield stack
    finally:
        stack.stop()


@contextlib.contextmanager
def running(kind: str, config):
    """One server process (target, draft or router) for the duration of the block."""
    process = spawn(kind, config, env=ENV)
    try:
        wait_ready(process, READY_TIMEOUT_S)
        yield process
    finally:
        process.stop()


def held_sequences(address: str) -> tuple[list[str], list[str]]:
    """Sequence ids the router's first target and first draft worker hold now (from GetServerInfo)."""
    from specdec.client import Client

    with Client(address) as client:
        info = client.server_info()
    return list(info.targets[0].info.sequence_ids), list(info.drafts[0].info.sequence_ids)


def wait_released(address: str, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while held_sequences(address) != ([], []):
        assert time.monotonic() < deadline, f"sequences still held: {held_sequences(address)}"
        time.sleep(0.1)
