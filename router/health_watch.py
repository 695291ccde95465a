"""The router's view of its workers' own health: one gRPC health Watch stream per worker.

A worker that drains (SIGTERM) or whose decode loop broke turns NOT_SERVING at once; the watch hears
it and the router stops placing work there, before any call of its would be refused. A stream that
breaks (the worker exited or is unreachable) says nothing either way: the worker counts as serving
again and the calls themselves decide (UNAVAILABLE benches it, router.pool). The stream is re-opened
every RETRY_S, so a worker that comes back serving is used again without a restart of the router.
"""
from __future__ import annotations

import threading

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

RETRY_S = 1.0
SERVING = health_pb2.HealthCheckResponse.SERVING


class HealthWatch:
    def __init__(self, channel: grpc.Channel, on_change):
        """on_change(serving: bool) runs whenever the worker's reported health changes."""
        self.stub = health_pb2_grpc.HealthStub(channel)
        self.on_change = on_change
        self.stopped = threading.Event()
        self.call = None
        threading.Thread(target=self._run, name="health-watch", daemon=True).start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            try:
                self.call = self.stub.Watch(health_pb2.HealthCheckRequest(service=""))
                for response in self.call:
                    self.on_change(response.status == SERVING)
            except grpc.RpcError:
                pass
            self.on_change(True)  # unknown: the calls decide
            self.stopped.wait(RETRY_S)

    def stop(self) -> None:
        self.stopped.set()
        if self.call is not None:
            self.call.cancel()
