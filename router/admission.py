"""Admission: which waiting request runs next, and on which target.

A request is admitted when three things allow it: the router's `max_active`, its user's share
(`max_active_per_user`), and free KV cache on some target. Each request claims prompt + max_new_tokens
tokens of KV for its whole life (a target cannot run out halfway: it has promised those tokens). The
router keeps its own ledger per target, starting from the capacity the target reports, and places
each request on the target with the most free tokens, so the targets drain evenly.

Whatever cannot start yet waits in a `FairQueue` (one FIFO per user). Beyond `max_queue` waiting (or
`max_queued_per_user` for one user) a request is refused at once with RESOURCE_EXHAUSTED rather than
left to time out: a client behind a load balancer can retry elsewhere. A request larger than any
target's whole cache can never run and gets INVALID_ARGUMENT.

Nothing accepted is lost. A head that does not fit lets smaller requests behind other users' heads
go first (the cache stays busy), but only `MAX_PASSED_OVER` times: then it is pinned, nobody else
starts until it fits, and the running sequences (bounded by max_new_tokens and deadlines) make room.
A waiting request leaves the queue with DEADLINE_EXCEEDED or CANCELLED and nothing else.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

from router.fair_queue import FairQueue, Ticket
from specdec.errors import Cancelled, DeadlineExceeded, InvalidArgument, ResourceExhausted, Unavailable
from specdec.kv_ledger import KvLedger

POLL_S = 0.25  # how often a waiting request checks its deadline, its call and target health
MAX_PASSED_OVER = 8
WAIT_WINDOW = 512  # queue waits of the most recent admissions, for the p50 / p99 figures


@dataclass(frozen=True)
class AdmissionFigures:
    num_active: int
    num_queued: int
    users: dict  # user -> (num_active, num_queued), users with anything running or waiting
    num_admitted: int
    num_rejected: int  # refused at once: queue full
    num_abandoned: int  # left the queue: deadline or cancellation
    wait_p50_s: float
    wait_p99_s: float
    kv_capacity_tokens: int  # summed over targets that report it
    kv_reserved_tokens: int  # this router's reservations, summed


class Admission:
    def __init__(self, max_active: int, max_queue: int, num_targets: int = 1, max_active_per_user: int = 0,
                 max_queued_per_user: int = 0, is_healthy: Callable[[int], bool] = lambda index: True,
                 clock: Callable[[], float] = time.monotonic):
        self.max_active, self.max_queue = max_active, max_queue
        self.max_active_per_user, self.max_queued_per_user = max_active_per_user, max_queued_per_user
        self.is_healthy, self.clock = is_healthy, clock
        self.cond = threading.Condition()
        self.rooms = [KvLedger() for _ in range(num_targets)]  # per target, this router's reservations
        self.retired: set[int] = set()  # targets discovery no longer lists (router.discovery): out of the sums
        self.queue = FairQueue()
        self.active_by_user: dict[str, int] = {}
        self.num_active = self.num_admitted = self.num_rejected = self.num_abandoned = 0
        self.arrivals = itertools.count()
        self.waits: deque = deque(maxlen=WAIT_WINDOW)

    # -- calls from the servicer ---------------------------------------------------------------
    def acquire(self, is_active: Callable[[], bool], time_remaining: Callable[[], float | None],
                user: str = "", tokens: int = 0) -> Ticket:
        """Block until the request may start; the ticket names its target. Always `release` it."""
        with self.cond:
            self._check_possible(tokens)
            ticket = Ticket(user, tokens, next(self.arrivals), self.clock())
            self.queue.push(ticket)
            self._dispatch()
            if ticket.target is None:
                self._refuse_if_full(ticket)
            try:
                while ticket.target is None:
                    if not is_active():
                        raise Cancelled("cancelled while queued")
                    left = time_remaining()
                    if left is not None and left <= 0:
                        waited = self.clock() - ticket.enqueued_at
                        raise DeadlineExceeded(f"deadline passed while queued ({waited:.1f} s waited; "
                                               f"{self.num_active} running, {len(self.queue)} queued)")
                    self.cond.wait(POLL_S if left is None else min(POLL_S, left))
                    if ticket.target is None:
                        self._dispatch()  # a benched target may be back
            except BaseException:
                if self.queue.remove(ticket):
                    self.num_abandoned += 1
                else:  # granted in the same instant: hand the room back
                    self._release(ticket)
                raise
            return ticket

    def release(self, ticket: Ticket) -> None:
        with self.cond:
            self._release(ticket)

    def move(self, ticket: Ticket) -> int:
        """Failover: the ticket's target died (and is benched). Its reservation moves to the healthy
        target with the most room that fits it, at once; Unavailable if none fits now."""
        with self.cond:
            index = self._place(ticket.tokens)
            if index is None:
                raise Unavailable(f"no other healthy target has room for its {ticket.tokens} tokens of KV cache "
                                  f"({self._kv_text()})")
            self.rooms[ticket.target].give_back(ticket.tokens)
            self.rooms[index].reserve(ticket.tokens)
            ticket.target = index
            self._dispatch()  # the dead target's room is its own again (for when it is back)
            return index

    def update_target(self, index: int, capacity_tokens: int, max_sequences: int) -> None:
        """A target reported its limits (0 = unknown); more room may let waiting requests start."""
        with self.cond:
            room = self.rooms[index]
            room.capacity_tokens, room.max_sequences = max(capacity_tokens, 0), max(max_sequences, 0)
            self._dispatch()

    def add_target(self) -> int:
        """A target found while running (router.discovery); its index. Its capacity comes by update_target."""
        with self.cond:
            self.rooms.append(KvLedger())
            return len(self.rooms) - 1

    def set_retired(self, index: int, retired: bool) -> None:
        """A target that left (or came back): its room no longer counts in capacities and figures."""
        with self.cond:
            (self.retired.add if retired else self.retired.discard)(index)
            self._dispatch()

    def _live_rooms(self) -> list[KvLedger]:
        return [room for i, room in enumerate(self.rooms) if i not in self.retired]

    def counts(self) -> tuple[int, int]:
        with self.cond:
            return self.num_active, len(self.queue)

    def largest_request_tokens(self) -> int:
        """The most KV tokens one request can ever be granted (0 = unknown: some target does not say)."""
        with self.cond:
            rooms = self._live_rooms()
            return max(r.capacity_tokens for r in rooms) if rooms and all(r.capacity_tokens for r in rooms) else 0

    def figures(self) -> AdmissionFigures:
        with self.cond:
            queued = self.queue.queued_by_user()
            users = {u: (self.active_by_user.get(u, 0), queued.get(u, 0)) for u in {*self.active_by_user, *queued}}
            waits = sorted(self.waits)
            return AdmissionFigures(
                self.num_active, len(self.queue), users, self.num_admitted, self.num_rejected, self.num_abandoned,
                _percentile(waits, 50), _percentile(waits, 99), sum(r.capacity_tokens for r in self._live_rooms()),
                sum(r.reserved_tokens for r in self.rooms))

    # -- under the lock -------------------------------------------------------------------------
    def _check_possible(self, tokens: int) -> None:
        if not any(self.is_healthy(i) for i in range(len(self.rooms))):
            raise Unavailable("no healthy target worker")
        rooms = self._live_rooms()
        if rooms and all(r.capacity_tokens for r in rooms):
            largest = max(r.capacity_tokens for r in rooms)
            if tokens > largest:
                raise InvalidArgument(f"the request needs {tokens} tokens of KV cache (prompt plus max_new_tokens), "
                                      f"more than any target holds (largest: {largest} tokens)")

    def _refuse_if_full(self, ticket: Ticket) -> None:
        mine = self.queue.queued_by_user().get(ticket.user, 0)
        if self.max_queued_per_user and mine > self.max_queued_per_user:
            reason = (f"server busy for user {ticket.user!r}: {mine - 1} of their requests already queued "
                      f"(limit {self.max_queued_per_user}); retry later")
        elif len(self.queue) > self.max_queue:
            reason = (f"server busy: {self.num_active} generations running (limit {self.max_active}) and "
                      f"{len(self.queue) - 1} queued (limit {self.max_queue}), {self._kv_text()}; retry later")
        else:
            return
        self.queue.remove(ticket)
        self.num_rejected += 1
        raise ResourceExhausted(reason)

    def _kv_text(self) -> str:
        capacity = sum(r.capacity_tokens for r in self._live_rooms())
        reserved = sum(r.reserved_tokens for r in self.rooms)
        return f"KV cache {reserved} of {capacity or 'unknown'} tokens reserved"

    def _dispatch(self) -> None:
        """Start waiting requests while slots and KV room allow; wake their threads."""
        started = False
        while self.num_active < self.max_active and len(self.queue):
            pick = self._pick()
            if pick is None:
                break
            ticket, index = pick
            self.queue.remove(ticket)
            self._grant(ticket, index)
            started = True
        if started:
            self.cond.notify_all()

    def _pick(self) -> tuple[Ticket, int] | None:
        heads = [t for t in self.queue.heads(self.active_by_user) if not self._at_user_cap(t.user)]
        starved = [t for t in heads if t.passed_over >= MAX_PASSED_OVER]
        if starved:
            heads = [min(starved, key=lambda t: t.arrival)]
        for i, ticket in enumerate(heads):
            index = self._place(ticket.tokens)
            if index is not None:
                for other in heads[:i]:  # they came first but did not fit
                    other.passed_over += 1
                return ticket, index
        return None

    def _place(self, tokens: int) -> int | None:
        """The healthy target with the most free KV tokens that fits `tokens` (ties: fewest sequences)."""
        fitting = [i for i, room in enumerate(self.rooms) if self.is_healthy(i) and room.fits(tokens)]
        if not fitting:
            return None
        return max(fitting, key=lambda i: (self.rooms[i].free_tokens(), -self.rooms[i].num_sequences, -i))

    def _at_user_cap(self, user: str) -> bool:
        return bool(self.max_active_per_user) and self.active_by_user.get(user, 0) >= self.max_active_per_user

    def _grant(self, ticket: Ticket, index: int) -> None:
        ticket.target = index
        self.rooms[index].reserve(ticket.tokens)
        self.num_active += 1
        self.active_by_user[ticket.user] = self.active_by_user.get(ticket.user, 0) + 1
        self.num_admitted += 1
        self.waits.append(self.clock() - ticket.enqueued_at)

    def _release(self, ticket: Ticket) -> None:
        if ticket.target is None or ticket.released:
            return
        ticket.released = True
        self.rooms[ticket.target].give_back(ticket.tokens)
        self.num_active -= 1
        left = self.active_by_user[ticket.user] - 1
        if left:
            self.active_by_user[ticket.user] = left
        else:
            del self.active_by_user[ticket.user]
        self._dispatch()


def _percentile(ordered: list[float], q: float) -> float:
    if not ordered:
        return 0.0
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]
