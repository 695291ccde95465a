"""Which workers the router uses, looked up again every `discovery_interval_s`: a worker that leaves
stops getting work and one that comes back (or starts again on a new address) is used again, with no
restart of the router and no call to it.

Three sources, merged in this order, duplicates dropped:
- the config's `targets` / `drafts` entries, `host:port` as given (gRPC resolves the name itself);
- entries `dns:NAME:PORT`: every address NAME resolves to is one worker (a Kubernetes headless
  Service, a round-robin record), looked up again each time, so records that appear or vanish are
  workers that join or leave;
- `workers_file`: a YAML file `{targets: [host:port, ...], drafts: [...]}` that something else keeps
  current. The Ray deployment (specdec.deploy) rewrites it from its actors, so a worker that Ray
  restarts on a new port is found within one interval; an operator may edit it by hand. A missing
  file lists nobody; a file that cannot be read keeps the last set that could (a half-written edit
  never empties the router).
"""
from __future__ import annotations

import logging
import socket
import threading
from typing import Callable

from specdec.errors import InvalidArgument
from specdec.worker_list import WorkerSet, read_workers_file

log = logging.getLogger(__name__)
DNS_PREFIX = "dns:"


def split_host_port(entry: str) -> tuple[str, int]:
    host, sep, port = entry.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise InvalidArgument(f"worker address {entry!r} is not HOST:PORT")
    return host, int(port)


def resolve_entry(entry: str, getaddrinfo: Callable = socket.getaddrinfo) -> list[str]:
    """`dns:NAME:PORT` -> one `ip:port` per address record (IPv4 first, sorted: a stable order);
    anything else -> itself. A name that does not resolve (now) is no worker, not an error."""
    if not entry.startswith(DNS_PREFIX):
        return [entry]
    host, port = split_host_port(entry[len(DNS_PREFIX):])
    try:
        records = getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        log.warning("%s does not resolve now (%s): no workers from it", entry, exc)
        return []
    v4 = sorted({r[4][0] for r in records if r[0] == socket.AF_INET})
    v6 = sorted({r[4][0] for r in records if r[0] == socket.AF_INET6})
    return [f"{ip}:{port}" for ip in v4] + [f"[{ip}]:{port}" for ip in v6]


def _unique(items) -> tuple[str, ...]:
    return tuple(dict.fromkeys(items))


class Discovery:
    """Finds the workers now (`find`) and keeps finding them on a thread (`start`), calling
    `on_change(WorkerSet)` whenever the set differs from the last one."""

    def __init__(self, targets: tuple[str, ...], drafts: tuple[str, ...], workers_file: str | None,
                 interval_s: float, getaddrinfo: Callable = socket.getaddrinfo):
        self.targets, self.drafts, self.workers_file = targets, drafts, workers_file
        self.interval_s, self.getaddrinfo = interval_s, getaddrinfo
        self.from_file = WorkerSet()
        self.stopped = threading.Event()
        self.thread: threading.Thread | None = None

    @property
    def dynamic(self) -> bool:
        """Whether looking again can find anything new."""
        return self.workers_file is not None or any(e.startswith(DNS_PREFIX) for e in self.targets + self.drafts)

    def find(self) -> WorkerSet:
        if self.workers_file is not None:
            try:
                self.from_file = read_workers_file(self.workers_file)
            except InvalidArgument as exc:
                log.warning("%s; keeping the workers it listed before", exc)
        resolved = [[a for e in entries for a in resolve_entry(e, self.getaddrinfo)]
                    for entries in (self.targets, self.drafts)]
        return WorkerSet(_unique(resolved[0] + list(self.from_file.targets)),
                         _unique(resolved[1] + list(self.from_file.drafts)))

    def start(self, current: WorkerSet, on_change: Callable[[WorkerSet], None]) -> None:
        if not self.dynamic:
            return

        def loop() -> None:
            last = current
            while not self.stopped.wait(self.interval_s):
                found = self.find()
                if found != last:
                    log.warning("workers now: targets %s; drafts %s", ", ".join(found.targets) or "none",
                                ", ".join(found.drafts) or "none")
                    try:
                        on_change(found)
                        last = found
                    except Exception:  # noqa: BLE001 - a failed update is retried at the next look
                        log.exception("updating the workers failed")

        self.thread = threading.Thread(target=loop, name="discovery", daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.stopped.set()
        if self.thread is not None:
            self.thread.join(timeout=5.0)
