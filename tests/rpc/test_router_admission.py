"""The router's admission without processes: fair queue order, KV placement, bounds, starvation, figures."""
from __future__ import annotations

import threading
import time

import pytest

from router.admission import MAX_PASSED_OVER, Admission
from router.fair_queue import FairQueue, Ticket
from specdec.errors import Cancelled, DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable

WAIT_S = 5.0


class Waiter:
    """acquire() on its own thread, as a gRPC handler thread would."""

    def __init__(self, admission: Admission, user: str, tokens: int = 0, deadline_s: float | None = None):
        self.ticket, self.error, self.cancelled = None, None, False
        self.done = threading.Event()
        end = None if deadline_s is None else time.monotonic() + deadline_s

        def run():
            try:
                self.ticket = admission.acquire(lambda: not self.cancelled,
                                                lambda: None if end is None else end - time.monotonic(), user, tokens)
            except Exception as exc:  # noqa: BLE001 - the test inspects it
                self.error = exc
            self.done.set()

        threading.Thread(target=run, daemon=True).start()

    def wait(self) -> Ticket:
        assert self.done.wait(WAIT_S), "not admitted in time"
        if self.error is not None:
            raise self.error
        return self.ticket


def until(condition, timeout_s: float = WAIT_S) -> None:
    end = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < end, "condition not reached"
        time.sleep(0.005)


def now(admission: Admission, user: str, tokens: int = 0) -> Ticket:
    """An acquire that must succeed at once."""
    return admission.acquire(lambda: True, lambda: 0.0, user, tokens)


def queue_up(admission: Admission, user: str, tokens: int = 0, **kwargs) -> Waiter:
    """Start a waiter and return once it sits in the queue (so arrival order is the call order)."""
    before = admission.counts()[1]
    waiter = Waiter(admission, user, tokens, **kwargs)
    until(lambda: admission.counts()[1] == before + 1 or waiter.done.is_set())
    return waiter


def test_fair_queue_orders_heads_by_running_then_arrival():
    queue = FairQueue()
    tickets = [Ticket(user, 1, i, 0.0) for i, user in enumerate("aaab")]
    for t in tickets:
        queue.push(t)
    assert queue.heads({}) == [tickets[0], tickets[3]]
    assert queue.heads({"a": 2, "b": 0}) == [tickets[3], tickets[0]]  # b runs nothing: b first
    assert queue.queued_by_user() == {"a": 3, "b": 1} and len(queue) == 4
    assert queue.remove(tickets[0]) and not queue.remove(tickets[0])
    queue.remove(tickets[3])
    assert queue.heads({"a": 2}) == [tickets[1]] and "b" not in queue.users


def test_a_flooding_user_does_not_starve_another():
    admission = Admission(max_active=2, max_queue=10)
    running = [now(admission, "a"), now(admission, "a")]
    queued_a = [queue_up(admission, "a") for _ in range(3)]
    b = queue_up(admission, "b")
    admission.release(running[0])
    assert b.wait().target == 0  # b went before a's three earlier requests
    assert not any(w.done.is_set() for w in queued_a)
    admission.release(running[1])
    first = queued_a[0].wait()  # then a's, in a's own order
    assert not queued_a[1].done.is_set()
    for ticket in (first, b.ticket):
        admission.release(ticket)
    for w in queued_a[1:]:
        admission.release(w.wait())
    assert admission.counts() == (0, 0)


def test_kv_capacity_admits_placing_on_the_emptiest_target():
    admission = Admission(max_active=8, max_queue=8, num_targets=2)
    admission.update_target(0, capacity_tokens=100, max_sequences=8)
    admission.update_target(1, capacity_tokens=200, max_sequences=8)
    first = now(admission, "a", 120)
    assert first.target == 1  # 200 free beats 100
    second = now(admission, "b", 90)
    assert second.target == 0  # 100 free beats 80
    third = queue_up(admission, "c", 90)  # 10 and 80 free: waits
    assert not third.done.is_set()
    admission.release(first)
    assert third.wait().target == 1
    figures = admission.figures()
    assert (figures.kv_capacity_tokens, figures.kv_reserved_tokens) == (300, 180)
    assert figures.num_admitted == 3 and figures.users == {"b": (1, 0), "c": (1, 0)}


def test_target_sequence_limit_and_health():
    healthy = {0: True, 1: True}
    admission = Admission(max_active=8, max_queue=8, num_targets=2, is_healthy=healthy.get)
    admission.update_target(0, 1000, max_sequences=1)
    admission.update_target(1, 1000, max_sequences=1)
    tickets = [now(admission, "a", 10), now(admission, "a", 10)]
    assert sorted(t.target for t in tickets) == [0, 1]
    waiter = queue_up(admission, "a", 10)  # both targets hold their one sequence
    healthy[0] = False
    admission.release(next(t for t in tickets if t.target == 0))
    time.sleep(0.3)
    assert not waiter.done.is_set()  # target 0 has room but is benched
    healthy[0] = True
    assert waiter.wait().target == 0  # noticed on the next poll
    healthy[0] = healthy[1] = False
    with pytest.raises(Unavailable, match="no healthy target"):
        now(admission, "a", 10)


def test_a_request_larger_than_any_target_is_invalid():
    admission = Admission(max_active=8, max_queue=8, num_targets=2)
    admission.update_target(0, 100, 8)
    unknown = now(admission, "a", 150)  # target 1's capacity is unknown: it is the target's call
    assert unknown.target == 1
    admission.release(unknown)
    admission.update_target(1, 120, 8)
    with pytest.raises(InvalidArgument, match=r"needs 150 tokens of KV cache .*largest: 120 tokens"):
        now(admission, "a", 150)


def test_queue_bounds_refuse_at_once_with_numbers():
    admission = Admission(max_active=1, max_queue=2, max_queued_per_user=1)
    held = now(admission, "a")
    waiters = [queue_up(admission, "a"), queue_up(admission, "b")]
    with pytest.raises(ResourceExhausted, match=r"user 'a': 1 of their requests already queued \(limit 1\)"):
        now(admission, "a")
    with pytest.raises(ResourceExhausted, match=r"busy: 1 generations running \(limit 1\) and 2 queued \(limit 2\)"):
        now(admission, "c")
    assert admission.figures().num_rejected == 2 and admission.counts() == (1, 2)
    admission.release(held)
    for w in waiters:
        admission.release(w.wait())


def test_deadline_and_cancellation_while_queued():
    admission = Admission(max_active=1, max_queue=4)
    held = now(admission, "a")
    late = Waiter(admission, "b", deadline_s=0.2)
    gone = queue_up(admission, "c")
    gone.cancelled = True
    with pytest.raises(DeadlineExceeded, match="while queued"):
        late.wait()
    with pytest.raises(Cancelled, match="while queued"):
        gone.wait()
    figures = admission.figures()
    assert (figures.num_abandoned, figures.num_queued, figures.num_active) == (2, 0, 1)
    admission.release(held)
    admission.release(held)  # idempotent
    assert admission.counts() == (0, 0)


def test_per_user_active_cap():
    admission = Admission(max_active=4, max_queue=4, max_active_per_user=1)
    a1 = now(admission, "a")
    a2 = queue_up(admission, "a")
    b1 = now(admission, "b")  # a is at its cap; b is not
    assert not a2.done.is_set()
    admission.release(a1)
    admission.release(a2.wait())
    admission.release(b1)


def test_a_large_request_is_not_starved_by_small_ones():
    """Small requests may pass a waiting large one only MAX_PASSED_OVER times; then it is pinned."""
    admission = Admission(max_active=64, max_queue=64)
    admission.update_target(0, capacity_tokens=100, max_sequences=64)
    small = [now(admission, "small0", 10)]
    big = queue_up(admission, "big", 100)
    passed = []
    for i in range(MAX_PASSED_OVER):
        passed.append(now(admission, f"small{i + 1}", 10))  # fits beside the others: backfills
    pinned = queue_up(admission, "late", 10)  # would fit, but the big one has been passed over enough
    time.sleep(0.3)
    assert not pinned.done.is_set() and not big.done.is_set()
    for ticket in small + passed:
        admission.release(ticket)
    admission.release(big.wait())
    admission.release(pinned.wait())
    figures = admission.figures()
    assert figures.num_admitted == MAX_PASSED_OVER + 3 and figures.kv_reserved_tokens == 0
    assert 0.0 <= figures.wait_p50_s <= figures.wait_p99_s < WAIT_S
