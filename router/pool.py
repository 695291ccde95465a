"""Worker choice: the healthy worker with the fewest sequences assigned by this router.

A worker whose call fails with UNAVAILABLE is benched for `bench_s` and then tried again, so a
restarted worker rejoins without anyone telling the router. Back from the bench it is on probation
until a call to it succeeds: callers that would pay for its silence (a target told to expect drafts
waits for them) check it first with a quick call (`on_probation`, `cleared`). A worker that reports
NOT_SERVING (draining, or broken) gets no new work until it reports SERVING (router.health_watch).
Channels carry this router's credentials (specdec.rpc.security).

Discovery (router.discovery) may change the set of addresses while the router runs (`sync`): a new
address is appended, one that vanished is marked gone (never chosen, its running sequences end as
their streams do) and one that reappears is back on probation. Indices never move or get reused,
so admission's per-target ledgers (router.admission) stay attached to the same worker.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass

from router.health_watch import HealthWatch
from specdec.rpc.security import open_channel
from specdec.rpc.server import channel_options
from specdec.security_config import SecurityConfig

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
    gone: bool = False  # discovery no longer lists it
    serving: bool = True  # its own health report (False while it drains)
    watch: HealthWatch | None = None

    @property
    def healthy(self) -> bool:
        return not self.gone and self.serving and time.monotonic() >= self.benched_until


class WorkerPool:
    def __init__(self, addresses: tuple[str, ...], stub_cls, bench_s: float = 5.0, wrap=lambda channel: channel,
                 security: SecurityConfig = SecurityConfig()):
        """wrap(channel): the channel the stub uses (telemetry's tracing interceptor)."""
        self.lock = threading.Lock()
        self.bench_s = bench_s
        self.stub_cls, self.wrap, self.security = stub_cls, wrap, security
        self.workers = [self.connect(a) for a in addresses]

    def connect(self, address: str) -> Worker:
        """A worker with its own credentialed channel, its stub, and a watch on its health."""
        channel = open_channel(address, self.security, channel_options() + RECONNECT_OPTIONS)
        worker = Worker(address, self.stub_cls(self.wrap(channel)))
        worker.watch = HealthWatch(channel, lambda serving, worker=worker: setattr(worker, "serving", serving))
        return worker

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

    def sync(self, addresses: tuple[str, ...]) -> tuple[list[int], list[int]]:
        """Make `addresses` the live set; returns (indices new or back, indices gone)."""
        with self.lock:
            known = {w.address: i for i, w in enumerate(self.workers)}
            joined, left = [], []
            for address in addresses:
                if address not in known:
                    self.workers.append(self.connect(address))
                    joined.append(len(self.workers) - 1)
                elif self.workers[known[address]].gone:
                    worker = self.workers[known[address]]
                    worker.gone, worker.on_probation, worker.benched_until = False, True, 0.0
                    joined.append(known[address])
            wanted = set(addresses)
            for index, worker in enumerate(self.workers):
                if not worker.gone and worker.address not in wanted:
                    worker.gone = True
                    left.append(index)
            return joined, left
