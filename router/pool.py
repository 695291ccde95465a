"""Worker choice: the healthy worker with the fewest sequences assigned by this router.

A worker whose call fails with UNAVAILABLE is benched for `bench_s` and then tried again, so a
restarted worker rejoins without anyone telling the router. Back from the bench it is on probation
until a call to it succeeds: callers that would pay for its silence (a target told to expect drafts
waits for them) check it first with a quick call (`on_probation`, `cleared`).
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

import grpc

from specdec.rpc.server import channel_options

# gRPC's own reconnect back-off grows to two minutes while a worker is down; a worker restarted on its
# address (specdec serve's supervisor) must be reachable again within a second of its return.
RECONNECT_OPTIONS = [("grpc.initial_reconnect_backoff_ms", 250), ("grpc.min_reconnect_backoff_ms", 250),
                     ("grpc.max_reconnect_backoff_ms", 1000)]


@dataclass
class Worker:
    address: str
    stub: object
    num_assigned: int = 0
    benched_until: float = 0.0
    on_probation: bool = False  # benched before, not yet seen answering since

    @property
    def healthy(self) -> bool:
        return time.monotonic() >= self.benched_until


class WorkerPool:
    def __init__(self, addresses: tuple[str, ...], stub_cls, bench_s: float = 5.0, wrap=lambda channel: channel):
        """wrap(channel): the channel the stub uses (telemetry's tracing interceptor)."""
        self.lock = threading.Lock()
        self.bench_s = bench_s
        options = channel_options() + RECONNECT_OPTIONS
        self.workers = [Worker(a, stub_cls(wrap(grpc.insecure_channel(a, options=options)))) for a in addresses]

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
