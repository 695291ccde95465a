"""Worker choice: the healthy worker with the fewest sequences assigned by this router.

A worker whose call fails with UNAVAILABLE is benched for `bench_s` and then tried again, so a
restarted worker rejoins without anyone telling the router. Back from the bench it is on probation
until a call to it succeeds: callers that would pay for its silence (a target told to expect drafts
waits for them) check it first with a quick call (`on_probation`, `cleared`). A worker that reports
NOT_SERVING (draining, or broken) gets no new work until it reports SERVING (router.health_watch).
Channels carry this router's credentials (specdec.rpc.security).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from router.health_watch import HealthWatch
from specdec.rpc.security import open_channel
from specdec.rpc.server import channel_options
from specdec.security_config import SecurityConfig


@dataclass
class Worker:
    address: str
    stub: object
    num_assigned: int = 0
    benched_until: float = 0.0
    on_probation: bool = False  # benched before, not yet seen answering since
    serving: bool = True  # its own health report (False while it drains)
    watch: HealthWatch | None = None

    @property
    def healthy(self) -> bool:
        return self.serving and time.monotonic() >= self.benched_until


class WorkerPool:
    def __init__(self, addresses: tuple[str, ...], stub_cls, bench_s: float = 5.0, wrap=lambda channel: channel,
                 security: SecurityConfig = SecurityConfig()):
        """wrap(channel): the channel the stub uses (telemetry's tracing interceptor)."""
        self.lock = threading.Lock()
        self.bench_s = bench_s
        self.workers = []
        for address in addresses:
            channel = open_channel(address, security, channel_options())
            worker = Worker(address, stub_cls(wrap(channel)))
            worker.watch = HealthWatch(channel, lambda serving, worker=worker: setattr(worker, "serving", serving))
            self.workers.append(worker)

    def close(self) -> None:
        for worker in self.workers:
            worker.watch.stop()

    def acquire(self) -> Worker | None:
        with self.lock:
            healthy = [w for w in self.workers if w.healthy]
            if not healthy:
                return None
            worker = min(healthy, key=lambda w: w.num_assigned)
            worker.num_assigned += 1
            return worker

    def release(self, worker: Worker) -> None:
        with self.lock:
            worker.num_assigned -= 1

    def bench(self, worker: Worker) -> None:
        with self.lock:
            worker.benched_until = time.monotonic() + self.bench_s
            worker.on_probation = True

    def cleared(self, worker: Worker) -> None:
        """It answered: off probation."""
        with self.lock:
            worker.on_probation = False
