"""An HTTP request as the dispatcher's call, and the dispatcher's blocking stream as an async iterator.

The dispatcher was written for gRPC's thread-per-call model: it blocks in admission and on the
target's stream, and learns about cancellation and deadlines through the call. `HttpCall` gives it
those four methods for an HTTP request; `generations` runs it on a thread of its own and hands each
response to the event loop, so a slow generation never stalls another request's loop.
"""
from __future__ import annotations

import asyncio
import threading
import time
from typing import AsyncIterator, Callable

from router.dispatcher import Dispatcher
from router.openai_schema import ParsedRequest


class HttpCall:
    """What the dispatcher asks of a call (the part of grpc.ServicerContext it uses), for one HTTP request."""

    def __init__(self, peer: str, timeout_s: float | None):
        self._peer = peer
        self._deadline = None if timeout_s is None else time.monotonic() + timeout_s
        self._lock = threading.Lock()
        self._cancelled = False
        self._callbacks: list[Callable[[], None]] = []

    def is_active(self) -> bool:
        return not self._cancelled

    def time_remaining(self) -> float | None:
        return None if self._deadline is None else self._deadline - time.monotonic()

    def peer(self) -> str:
        return self._peer

    def add_callback(self, callback: Callable[[], None]) -> bool:
        with self._lock:
            if not self._cancelled:
                self._callbacks.append(callback)
                return True
        callback()  # already over: cancel what was just started
        return True

    def cancel(self) -> None:
        """The client went away (or the response is done): run the callbacks once, e.g. cancel the target call."""
        with self._lock:
            if self._cancelled:
                return
            self._cancelled, callbacks, self._callbacks = True, self._callbacks, []
        for callback in callbacks:
            callback()


async def generations(dispatcher: Dispatcher, parsed: ParsedRequest, call: HttpCall) -> AsyncIterator:
    """The dispatcher's blocking stream, run on its own thread, as an async iterator; leaving it cancels."""
    loop = asyncio.get_running_loop()
    inbox: asyncio.Queue = asyncio.Queue()
    end = object()

    def put(item) -> None:
        try:
            loop.call_soon_threadsafe(inbox.put_nowait, item)
        except RuntimeError:  # the loop has stopped (server shutting down)
            call.cancel()

    def run() -> None:
        try:
            for response in dispatcher.generate(parsed.request, call, fill_context=parsed.chat):
                put(response)
            put(end)
        except Exception as exc:  # noqa: BLE001 - handed to the request's coroutine
            put(exc)

    threading.Thread(target=run, name="http-generation", daemon=True).start()
    try:
        while (item := await inbox.get()) is not end:
            if isinstance(item, BaseException):
                raise item
            yield item
    finally:
        call.cancel()


async def cancel_on_disconnect(receive, call: HttpCall) -> None:
    while (await receive())["type"] != "http.disconnect":
        pass
    call.cancel()
