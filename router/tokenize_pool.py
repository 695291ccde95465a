"""Tokenizing off the request thread, with a bound on how much of it runs at once.

A prompt within `max_prompt_bytes` can still take a second or two to tokenize (a context's worth of
the longest tokens). The tokenizer lets go of the GIL while it encodes, so other requests are not
stalled by it; what must still be bounded is the CPU: a burst of large prompts encoded all at once
would take every core from the requests already running. So prompts above `inline_bytes` are
encoded on a small pool (`num_threads`), at most `max_waiting` more wait for it (beyond that the
request is refused at once with RESOURCE_EXHAUSTED), and the request thread waits for its result
while watching its call: a client that goes away or whose deadline passes stops waiting at once.
Short prompts (most of them) are encoded on the request thread: that costs microseconds and keeps
them out of the big prompts' queue.
"""
from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from typing import Callable

from router.prompts import PromptEncoder
from specdec.errors import Cancelled, DeadlineExceeded, ResourceExhausted

POLL_S = 0.1  # how often a waiting request checks its call


def prompt_bytes(prompt) -> int:
    """A text prompt's or chat messages' size in characters (<= bytes): what decides the lane."""
    if isinstance(prompt, str):
        return len(prompt)
    if prompt and isinstance(prompt[0], dict):
        return sum(len(m.get("content", "")) for m in prompt)
    return 0


class TokenizePool:
    def __init__(self, encoder: PromptEncoder, num_threads: int = 2, max_waiting: int = 8,
                 inline_bytes: int = 16384):
        self.encoder = encoder
        self.inline_bytes, self.capacity = inline_bytes, num_threads + max_waiting
        self.executor = ThreadPoolExecutor(max_workers=num_threads, thread_name_prefix="tokenize")
        self.lock = threading.Lock()
        self.num_in_pool = 0  # encoding or waiting to

    def encode(self, prompt, chat: bool, is_active: Callable[[], bool],
               time_remaining: Callable[[], float | None]) -> list[int]:
        if prompt_bytes(prompt) <= self.inline_bytes:
            return self.encoder.encode(prompt, chat)
        with self.lock:
            if self.num_in_pool >= self.capacity:
                raise ResourceExhausted(f"server busy: {self.num_in_pool} long prompts are being tokenized "
                                        f"or waiting to be; retry later")
            self.num_in_pool += 1
        future = self.executor.submit(self.encoder.encode, prompt, chat)
        future.add_done_callback(lambda _: self._leave())
        while True:
            left = time_remaining()
            if not is_active():
                future.cancel()
                raise Cancelled("cancelled while the prompt was being tokenized")
            if left is not None and left <= 0:
                future.cancel()
                raise DeadlineExceeded("deadline passed while the prompt was being tokenized")
            try:
                return future.result(timeout=POLL_S if left is None else min(POLL_S, left))
            except FutureTimeout:
                continue

    def _leave(self) -> None:
        with self.lock:
            self.num_in_pool -= 1

    def stop(self) -> None:
        self.executor.shutdown(wait=False, cancel_futures=True)
