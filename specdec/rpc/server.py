"""Starting a gRPC server the same way everywhere: status interceptor, standard health checking,
server reflection, 127.0.0.1 by default, a `ready` line once it accepts calls, clean stop on SIGTERM."""
from __future__ import annotations

import signal
import sys
import threading
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specdec.rpc.status import StatusInterceptor

MAX_MESSAGE_BYTES = 64 << 20  # a full-vocabulary q for a deep tree can pass 4 MiB


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...] = ()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def set_serving(self, serving: bool) -> None:
        """Health of every service of this server (the router stops placing work on NOT_SERVING)."""
        status = health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        for name in ["", *self.service_names]:
            self.health.set(name, status)

    def stop(self, grace_s: float = 2.0) -> None:
        self.health.enter_graceful_shutdown()
        self.server.stop(grace_s).wait(grace_s + 1.0)


def channel_options(max_receive_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    return [("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
            ("grpc.max_receive_message_length", min(max_receive_bytes, MAX_MESSAGE_BYTES))]


def start_server(register: Callable[[grpc.Server], None], service_names: list[str], port: int = 0,
                 host: str = "127.0.0.1", max_workers: int = 64,
                 interceptors: Sequence[grpc.ServerInterceptor] = (), max_receive_bytes: int = MAX_MESSAGE_BYTES,
                 max_concurrent_rpcs: int | None = None) -> RunningServer:
    """register(server) adds the servicers; service_names are their full names (for health/reflection);
    `interceptors` run before the status interceptor (an API key check, say). A message larger than
    `max_receive_bytes` is refused by gRPC before it is read (RESOURCE_EXHAUSTED); beyond
    `max_concurrent_rpcs` calls in progress a new call is refused at once (RESOURCE_EXHAUSTED) instead
    of waiting for a thread."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         interceptors=[*interceptors, StatusInterceptor()],
                         options=channel_options(max_receive_bytes), maximum_concurrent_rpcs=max_concurrent_rpcs)
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bound = server.add_insecure_port(f"{host}:{port}")
    if bound == 0:
        raise OSError(f"cannot bind {host}:{port}")
    server.start()
    for name in ["", *service_names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, bound, health_servicer, tuple(service_names))


def run_until_signalled(running: RunningServer, kind: str, on_stop: Callable[[], None] | None = None,
                        ready_detail: str = "", telemetry=None) -> int:
    """Print the ready line (what `specdec serve` and tests wait for), then block until SIGTERM/SIGINT.
    `ready_detail` is appended to it (the router's HTTP address), then the Prometheus endpoint's
    address if `telemetry` (specdec.telemetry.Telemetry) serves one; its spans are flushed at the end."""
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    metrics = getattr(getattr(telemetry, "metrics", None), "address", "")
    print(f"specdec {kind} ready on {running.address}{ready_detail}" + (f"; metrics on {metrics}" if metrics else ""),
          flush=True)
    stop.wait()
    if on_stop is not None:
        on_stop()
    running.stop()
    if telemetry is not None:
        telemetry.shutdown()
    sys.stdout.flush()
    return 0
