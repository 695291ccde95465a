"""Starting serving processes and the local stack, and always stopping them.

Each worker is `python -m specdec.cli serve <kind> --flags...`, bound to its `host` (127.0.0.1 by
default) on a free port (port 0), and tells us the address others dial on its ready line. Children get SIGTERM if this process dies
(PR_SET_PDEATHSIG), so neither a crashed test nor a killed `specdec serve` leaves servers behind.
"""
from __future__ import annotations

import ctypes
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

from specdec.errors import Unavailable
from specdec.serving_config import StackConfig, config_to_argv, with_workers

READY = re.compile(r"ready on (\S+:\d+)")
HTTP_READY = re.compile(r"http on (\S+:\d+)")  # the router's OpenAI-compatible HTTP API, on its ready line
METRICS_READY = re.compile(r"metrics on (\S+:\d+)")  # a server's Prometheus endpoint (--metrics-port)
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


@dataclass
class ServerProcess:
    kind: str
    popen: subprocess.Popen
    address: str = ""
    http_address: str = ""  # host:port of the router's HTTP API ("" = none)
    metrics_address: str = ""  # host:port of its Prometheus endpoint ("" = none)
    lines: list[str] = field(default_factory=list)  # everything it printed (stdout and stderr)

    def stop(self, timeout_s: float = 10.0) -> None:
        if self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(timeout_s)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(timeout_s)

    def kill(self) -> None:
        """SIGKILL: what a crash looks like to everyone else."""
        self.popen.kill()
        self.popen.wait(10.0)


def spawn(kind: str, config, env: dict | None = None) -> ServerProcess:
    """Start `specdec serve <kind>` with config's flags; call wait_ready() to learn its address."""
    argv = [sys.executable, "-m", "specdec.cli", "serve", kind, *config_to_argv(config)]
    popen = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
                             env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {})}, preexec_fn=_die_with_parent)
    return ServerProcess(kind, popen)


def wait_ready(process: ServerProcess, timeout_s: float, echo=None) -> str:
    """Read the process's output until its ready line; keep draining it afterwards."""
    lines: queue.Queue = queue.Queue()

    def pump() -> None:
        for line in process.popen.stdout:
            process.lines.append(line)
            lines.put(line)
            if echo is not None:
                echo(f"[{process.kind}] {line}")
        lines.put(None)

    threading.Thread(target=pump, daemon=True).start()
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            line = lines.get(timeout=max(deadline - time.monotonic(), 0.01))
        except queue.Empty:
            raise Unavailable(f"{process.kind} not ready after {timeout_s:.0f} s") from None
        if line is None:
            raise Unavailable(f"{process.kind} exited before it was ready:\n{''.join(process.lines[-20:])}")
        match = READY.search(line)
        if match:
            process.address = match.group(1)
            http, metrics = HTTP_READY.search(line), METRICS_READY.search(line)
            process.http_address = http.group(1) if http else ""
            process.metrics_address = metrics.group(1) if metrics else ""
            return process.address


@dataclass
class Stack:
    router: ServerProcess
    targets: list[ServerProcess]
    drafts: list[ServerProcess]

    @property
    def address(self) -> str:
        return self.router.address

    @property
    def http_address(self) -> str:
        return self.router.http_address

    def stop(self) -> None:
        """SIGTERM to all at once (each drains: what runs finishes), then wait for each; SIGKILL stragglers."""
        processes = [self.router, *self.drafts, *self.targets]
        for process in processes:
            if process.popen.poll() is None:
                process.popen.terminate()
        for process in processes:
            process.stop()


def start_stack(config: StackConfig, env: dict | None = None, echo=None) -> Stack:
    """Workers first (in parallel), then the router pointed at them. Stops everything on failure."""
    started: list[ServerProcess] = []
    try:
        targets = [spawn("target", c, env) for c in config.targets]
        started += targets
        drafts = [spawn("draft", c, env) for c in config.drafts]
        started += drafts
        for process in started:
            wait_ready(process, config.ready_timeout_s, echo)
        router_config = with_workers(config.router, tuple(p.address for p in targets),
                                     tuple(p.address for p in drafts))
        router = spawn("router", router_config, env)
        started.append(router)
        wait_ready(router, config.ready_timeout_s, echo)
        return Stack(router, targets, drafts)
    except BaseException:
        for process in started:
            process.stop()
        raise
