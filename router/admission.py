"""A bounded admission queue: at most max_active generations run, at most max_queue wait.

Beyond that a request is refused at once with RESOURCE_EXHAUSTED rather than left to time out,
which is what a client behind a load balancer needs to retry elsewhere.
"""
from __future__ import annotations

import threading
from typing import Callable

from specdec.errors import Cancelled, DeadlineExceeded, ResourceExhausted

POLL_S = 0.25


class Admission:
    def __init__(self, max_active: int, max_queue: int):
        self.max_active, self.max_queue = max_active, max_queue
        self.cond = threading.Condition()
        self.num_active = 0
        self.num_queued = 0

    def acquire(self, is_active: Callable[[], bool], time_remaining: Callable[[], float | None]) -> None:
        with self.cond:
            if self.num_active < self.max_active:
                self.num_active += 1
                return
            if self.num_queued >= self.max_queue:
                raise ResourceExhausted(f"server busy: {self.num_active} generations running and "
                                        f"{self.num_queued} queued (limit {self.max_queue}); retry later")
            self.num_queued += 1
            try:
                while self.num_active >= self.max_active:
                    if not is_active():
                        raise Cancelled("cancelled while queued")
                    left = time_remaining()
                    if left is not None and left <= 0:
                        raise DeadlineExceeded("deadline passed while queued")
                    self.cond.wait(POLL_S if left is None else min(POLL_S, left))
                self.num_active += 1
            finally:
                self.num_queued -= 1

    def release(self) -> None:
        with self.cond:
            self.num_active -= 1
            self.cond.notify()

    def counts(self) -> tuple[int, int]:
        with self.cond:
            return self.num_active, self.num_queued
