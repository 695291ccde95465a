"""Starting serving processes and the local stack, keeping them running, and always stopping them.

Each worker is `python -m specdec.cli serve <kind> --flags...`, bound to its `host` (127.0.0.1 by
default) on a free port (port 0), and tells us the address others dial on its ready line. Children get SIGTERM if this process dies
(PR_SET_PDEATHSIG), so neither a crashed test nor a killed `specdec serve` leaves servers behind.

`specdec serve` also supervises its stack (`Supervisor`): a process that dies is started again on
the same address, so the router, which knows workers by address, takes it back by itself once it
answers (router.pool benches a failed worker and tries it again; a router with two or more targets
meanwhile continues the dead target's generations elsewhere, router.relay).
"""
from __future__ import annotations

import ctypes
import dataclasses
import logging
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
from specdec.config_fields import config_to_argv
from specdec.serving_config import StackConfig, with_workers

log = logging.getLogger(__name__)
READY = re.compile(r"ready on (\S+:\d+)")
HTTP_READY = re.compile(r"http on (\S+:\d+)")  # the router's OpenAI-compatible HTTP API, on its ready line
METRICS_READY = re.compile(r"metrics on (\S+:\d+)")  # a server's Prometheus endpoint (--metrics-port)
PR_SET_PDEATHSIG = 1
PARENT_ENV = "SPECDEC_DIE_WITH"  # set by spawn(): the pid whose end should end the spawned server


def die_with_parent() -> None:
    """In a process spawn() started: SIGTERM when its parent ends (PR_SET_PDEATHSIG), asked by the child
    itself as it starts. Not a preexec_fn: with one, subprocess must fork and run Python before exec, gRPC's
    fork handlers restart its poller in that child, and the poller aborted the child on the epoll descriptor
    close_fds had just closed (grpc/grpc#43055; seen once: a draft worker dying before its ready line in a
    full test run). Without one, subprocess spawns by vfork + exec and no fork handler runs."""
    parent = os.environ.pop(PARENT_ENV, None)  # not inherited by this process's own children
    if parent is None:
        return
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
    if os.getppid() != int(parent):  # the parent ended before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


@dataclass
class ServerProcess:
    kind: str
    popen: subprocess.Popen
    address: str = ""
    http_address: str = ""  # host:port of the router's HTTP API ("" = none)
    metrics_address: str = ""  # host:port of its Prometheus endpoint ("" = none)
    lines: list[str] = field(default_factory=list)  # everything it printed (stdout and stderr)
    config: object = None  # what it was started with (a restart starts the same on the same address)
    env: dict | None = None
    started_at: float = field(default_factory=time.monotonic)

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
                             env={**os.environ, "HF_HUB_OFFLINE": "1", **(env or {}), PARENT_ENV: str(os.getpid())})
    return ServerProcess(kind, popen, config=config, env=env)


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

    supervisor: Supervisor | None = None

    def stop(self) -> None:
        """SIGTERM to all at once (each drains: what runs finishes), then wait for each; SIGKILL stragglers."""
        if self.supervisor is not None:  # first: nothing stopped here may be restarted
            self.supervisor.stop()
        processes = [self.router, *self.drafts, *self.targets]
        for process in processes:
            if process.popen.poll() is None:
                process.popen.terminate()
        for process in processes:
            process.stop()


def start_stack(config: StackConfig, env: dict | None = None, echo=None, supervise: bool = False) -> Stack:
    """Workers first (in parallel), then the router pointed at them. Stops everything on failure.
    supervise: restart any of them that dies (`Supervisor`), until `Stack.stop`."""
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
        stack = Stack(router, targets, drafts)
        if supervise:
            stack.supervisor = Supervisor(stack, config.ready_timeout_s, echo)
        return stack
    except BaseException:
        for process in started:
            process.stop()
        raise


def same_address(process: ServerProcess):
    """The config `process` was started with, bound to the addresses it got (port 0 became a port)."""
    ports = {"port": process.address, "http_port": process.http_address, "metrics_port": process.metrics_address}
    fields = {f.name for f in dataclasses.fields(process.config)}
    return dataclasses.replace(process.config, **{name: int(address.rsplit(":", 1)[1])
                                                  for name, address in ports.items() if address and name in fields})


class Supervisor:
    """Restarts a stack's processes that die, on the addresses they had, until stopped.

    One thread per process waits for it to end. A restart waits `backoff_s` first, doubled after each
    restart that did not last `stable_s` (up to `max_backoff_s`), so a process that cannot start (a
    port taken, a bad checkpoint) is retried ever more slowly instead of in a tight loop, and one that
    ran for a while is restarted quickly again. Restarts are started from the watching thread, which
    lives until `stop`: the child's PR_SET_PDEATHSIG is tied to the thread that started it."""

    def __init__(self, stack: Stack, ready_timeout_s: float, echo=None, backoff_s: float = 1.0,
                 max_backoff_s: float = 30.0, stable_s: float = 60.0, poll_s: float = 0.2):
        self.stack, self.ready_timeout_s, self.echo = stack, ready_timeout_s, echo or (lambda line: None)
        self.backoff_s, self.max_backoff_s, self.stable_s, self.poll_s = backoff_s, max_backoff_s, stable_s, poll_s
        self.stopped = threading.Event()
        self.lock = threading.Lock()
        self.starting: list[ServerProcess] = []  # restarts not ready yet (stop ends them)
        self.num_restarts = 0
        slots = [(lambda: stack.router, lambda p: setattr(stack, "router", p))]
        for group in (stack.targets, stack.drafts):
            slots += [(lambda g=group, i=i: g[i], lambda p, g=group, i=i: g.__setitem__(i, p)) for i in range(len(group))]
        self.threads = [threading.Thread(target=self._watch, args=slot, name="supervise", daemon=True) for slot in slots]
        for thread in self.threads:
            thread.start()

    def stop(self, timeout_s: float = 10.0) -> None:
        self.stopped.set()
        with self.lock:
            for process in self.starting:
                process.popen.terminate()
        for thread in self.threads:
            thread.join(timeout_s)

    def _watch(self, current, replace) -> None:
        delay, started_at = self.backoff_s, current().started_at
        while not self.stopped.is_set():
            process = current()
            while process.popen.poll() is None:
                if self.stopped.wait(self.poll_s):
                    return
            if time.monotonic() - started_at >= self.stable_s:
                delay = self.backoff_s
            self.echo(f"[supervisor] {process.kind} on {process.address} exited ({process.popen.returncode}); "
                      f"restarting it in {delay:g} s\n")
            if self.stopped.wait(delay):
                return
            delay, started_at = min(delay * 2, self.max_backoff_s), time.monotonic()
            try:
                replace(self._restart(process))
            except Exception:  # noqa: BLE001 - could not even start it (say, out of memory): try again later
                log.exception("restarting %s on %s failed", process.kind, process.address)

    def _restart(self, dead: ServerProcess) -> ServerProcess:
        process = spawn(dead.kind, same_address(dead), dead.env)
        with self.lock:
            self.starting.append(process)
        try:
            wait_ready(process, self.ready_timeout_s, self.echo)
            with self.lock:
                self.num_restarts += 1
            self.echo(f"[supervisor] {process.kind} back on {process.address}\n")
        except Unavailable as exc:  # it is watched like any other: dead, so restarted after a longer delay
            log.warning("restarting %s on %s failed: %s", dead.kind, dead.address, exc)
            process.stop()
            process.address, process.http_address, process.metrics_address = (
                dead.address, dead.http_address, dead.metrics_address)
        finally:
            with self.lock:
                self.starting.remove(process)
        if self.stopped.is_set():
            process.stop()
        return process
