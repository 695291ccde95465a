"""Waiting requests, one FIFO per user, and the order in which their heads are offered a slot.

A single FIFO lets one user who sends a hundred requests push everyone else's behind them. Here each
user has their own FIFO and only heads compete: the head of the user with the fewest generations
running goes first, ties to the one that arrived first. A flooding user therefore gets one turn per
freed slot like everyone else, and a user who has nothing running is served next.

Pure data, no locks and no clocks: `Admission` holds its lock around every call.
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Mapping


@dataclass(eq=False)
class Ticket:
    """One request's claim: `tokens` of KV (prompt + max_new_tokens) on one target, for `user`."""

    user: str
    tokens: int
    arrival: int  # order of arrival at the router (fairness tie-break)
    enqueued_at: float  # time.monotonic() when it arrived (queue wait figures)
    target: int | None = None  # index of the target it was granted; None while waiting
    passed_over: int = 0  # admissions of others while this one, at the head, did not fit
    released: bool = False


@dataclass
class FairQueue:
    users: dict[str, deque] = field(default_factory=dict)  # user -> waiting tickets, oldest first
    num_queued: int = 0

    def push(self, ticket: Ticket) -> None:
        self.users.setdefault(ticket.user, deque()).append(ticket)
        self.num_queued += 1

    def remove(self, ticket: Ticket) -> bool:
        """Take a ticket out wherever it is (granted, cancelled, expired); False if it was not queued."""
        waiting = self.users.get(ticket.user)
        if not waiting or ticket not in waiting:
            return False
        waiting.remove(ticket)
        if not waiting:
            del self.users[ticket.user]
        self.num_queued -= 1
        return True

    def heads(self, active_by_user: Mapping[str, int]) -> list[Ticket]:
        """Each user's oldest ticket, fewest running generations first, then earliest arrival."""
        return sorted((waiting[0] for waiting in self.users.values()),
                      key=lambda t: (active_by_user.get(t.user, 0), t.arrival))

    def queued_by_user(self) -> dict[str, int]:
        return {user: len(waiting) for user, waiting in self.users.items()}

    def __len__(self) -> int:
        return self.num_queued
