"""One long-lived Verify stream to a target worker, shared by every sequence drafted for it."""
from __future__ import annotations

import logging
import queue
import threading
from typing import Callable

import grpc

from specdec.rpc.security import open_channel
from specdec.rpc.server import channel_options
from specdec.rpc.v1 import target_pb2, target_pb2_grpc
from specdec.security_config import SecurityConfig

log = logging.getLogger(__name__)


class TargetLink:
    """send() queues a DraftMessage; every VerifyMessage goes to on_message(link, message);
    on_lost(link) runs once when the stream breaks (the target died or closed it)."""

    def __init__(self, address: str, on_message: Callable, on_lost: Callable,
                 security: SecurityConfig = SecurityConfig()):
        self.address = address
        self.outbox: queue.Queue = queue.Queue()
        self.channel = open_channel(address, security, channel_options())  # this worker's certificate / token
        self.alive = True
        self._on_message, self._on_lost = on_message, on_lost
        self.call = target_pb2_grpc.TargetWorkerStub(self.channel).Verify(self._requests())
        threading.Thread(target=self._read, name=f"link-{address}", daemon=True).start()

    def send(self, message: target_pb2.DraftMessage) -> None:
        self.outbox.put(message)

    def close(self) -> None:
        self.alive = False
        self.outbox.put(None)
        self.call.cancel()
        self.channel.close()

    def _requests(self):
        while True:
            item = self.outbox.get()
            if item is None:
                return
            yield item

    def _read(self) -> None:
        try:
            for message in self.call:
                self._on_message(self, message)
        except grpc.RpcError as exc:
            if self.alive:
                log.warning("stream to target %s ended: %s", self.address, exc.code())
        finally:
            self.alive = False
            self.outbox.put(None)
            self._on_lost(self)
