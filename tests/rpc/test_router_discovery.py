"""Worker discovery: DNS names with several records, the workers file, and what the router's pools and
admission make of a worker that leaves, comes back, or returns on a new address."""
from __future__ import annotations

import socket

import pytest

from router.admission import Admission
from router.discovery import Discovery, resolve_entry
from router.pool import WorkerPool
from specdec.errors import InvalidArgument, Unavailable
from specdec.worker_list import WorkerSet, read_workers_file, write_workers_file


def fake_dns(table: dict[str, list[str]]):
    """getaddrinfo over a table name -> addresses (':' in an address = IPv6)."""
    def getaddrinfo(host, port, type=0):
        if host not in table:
            raise socket.gaierror(socket.EAI_NONAME, "unknown")
        return [(socket.AF_INET6 if ":" in ip else socket.AF_INET, type, 6, "", (ip, port)) for ip in table[host]]
    return getaddrinfo


def test_a_dns_name_with_several_records_is_several_workers_and_plain_entries_stay_as_given():
    dns = fake_dns({"targets.svc": ["10.0.0.9", "10.0.0.2", "10.0.0.9", "fd00::1"]})
    assert resolve_entry("dns:targets.svc:50052", dns) == ["10.0.0.2:50052", "10.0.0.9:50052", "[fd00::1]:50052"]
    assert resolve_entry("some-host:1", dns) == ["some-host:1"]  # gRPC resolves it itself
    assert resolve_entry("dns:gone.svc:1", dns) == []  # not resolvable now: nobody, not an error
    with pytest.raises(InvalidArgument, match="HOST:PORT"):
        resolve_entry("dns:no-port", dns)


def test_the_workers_file_round_trips_and_a_broken_one_keeps_the_last_good_set(tmp_path):
    path = tmp_path / "workers.yaml"
    assert read_workers_file(path) == WorkerSet()  # missing: nobody
    write_workers_file(path, WorkerSet(("127.0.0.1:1",), ("127.0.0.1:2",)))
    assert read_workers_file(path) == WorkerSet(("127.0.0.1:1",), ("127.0.0.1:2",))
    discovery = Discovery(("127.0.0.1:1",), (), str(path), interval_s=1.0)
    assert discovery.dynamic and discovery.find() == WorkerSet(("127.0.0.1:1",), ("127.0.0.1:2",))  # no duplicate
    path.write_text("targets: [oops")
    with pytest.raises(InvalidArgument, match="not YAML"):
        read_workers_file(path)
    assert discovery.find() == WorkerSet(("127.0.0.1:1",), ("127.0.0.1:2",))
    path.write_text("targets: 5\n")
    with pytest.raises(InvalidArgument, match="list of HOST:PORT"):
        read_workers_file(path)
    assert not Discovery(("127.0.0.1:1",), (), None, 1.0).dynamic


def test_the_pool_marks_gone_workers_and_takes_back_returning_ones_on_probation():
    pool = WorkerPool(("a:1", "b:1"), stub_cls=lambda channel: object())
    assert pool.sync(("b:1", "c:1")) == ([2], [0])  # c joins at a new index, a left
    assert [w.healthy for w in pool.workers] == [False, True, True]
    chosen = {pool.acquire().address for _ in range(4)}
    assert chosen == {"b:1", "c:1"}
    assert pool.sync(("a:1", "b:1", "c:1")) == ([0], [])  # a is back, on probation, at its old index
    assert pool.workers[0].healthy and pool.workers[0].on_probation
    assert pool.sync(()) == ([], [0, 1, 2])
    assert pool.acquire() is None


def test_admission_counts_only_targets_that_discovery_still_lists():
    healthy = {0: True, 1: True}
    admission = Admission(4, 4, 1, is_healthy=lambda index: healthy[index])
    admission.update_target(0, 100, 4)
    index = admission.add_target()
    admission.update_target(index, 300, 4)
    assert index == 1 and admission.largest_request_tokens() == 300
    ticket = admission.acquire(lambda: True, lambda: 1.0, "u", 200)
    assert ticket.target == 1
    admission.release(ticket)
    healthy[1] = False
    admission.set_retired(1, True)
    assert admission.largest_request_tokens() == 100 and admission.figures().kv_capacity_tokens == 100
    with pytest.raises(InvalidArgument, match="more than any target"):
        admission.acquire(lambda: True, lambda: 1.0, "u", 200)
    healthy[0] = False
    with pytest.raises(Unavailable):
        admission.acquire(lambda: True, lambda: 1.0, "u", 10)
