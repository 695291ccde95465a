"""Starting a gRPC server the same way everywhere: status interceptor, standard health checking,
server reflection, 127.0.0.1 by default, credentials from the security section, a `ready` line once
it accepts calls, and on SIGTERM a drain: health NOT_SERVING, nothing new admitted, running work
finished within `drain_timeout_s`, then a clean stop (a second signal stops at once)."""
from __future__ import annotations

import gc
import signal
import sys
import threading
import time
from concurrent import futures
from dataclasses import dataclass
from typing import Callable, Sequence

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from specdec.rpc.security import TokenInterceptor, server_credentials
from specdec.rpc.status import StatusInterceptor
from specdec.security_config import LOOPBACK, SecurityConfig, advertised_host, insecure_notice, join_host_port

MAX_MESSAGE_BYTES = 64 << 20  # a full-vocabulary q for a deep tree can pass 4 MiB


@dataclass
class RunningServer:
    server: grpc.Server
    port: int
    health: health.HealthServicer
    service_names: tuple[str, ...] = ()
    host: str = LOOPBACK  # what others dial (the advertised host)

    @property
    def address(self) -> str:
        return join_host_port(self.host, self.port)

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
                 host: str = LOOPBACK, max_workers: int = 64,
                 interceptors: Sequence[grpc.ServerInterceptor] = (), max_receive_bytes: int = MAX_MESSAGE_BYTES,
                 max_concurrent_rpcs: int | None = None, security: SecurityConfig = SecurityConfig(),
                 internal: bool = True, advertise_host: str | None = None, kind: str = "server") -> RunningServer:
    """register(server) adds the servicers; service_names are their full names (for health/reflection);
    `interceptors` run before the status interceptor (an API key check, say). A message larger than
    `max_receive_bytes` is refused by gRPC before it is read (RESOURCE_EXHAUSTED); beyond
    `max_concurrent_rpcs` calls in progress a new call is refused at once (RESOURCE_EXHAUSTED) instead
    of waiting for a thread. `internal`: a worker's port, which with `security` demands a client
    certificate (mutual TLS) and the token; the router's public port only serves TLS and checks API keys."""
    token = security.token() if internal else None
    credentials = server_credentials(security, require_client_auth=internal)
    notice = insecure_notice(kind, host, security)
    if notice:
        print(notice, file=sys.stderr, flush=True)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=max_workers),
                         interceptors=[*([TokenInterceptor(token)] if token else ()), *interceptors,
                                       StatusInterceptor()],
                         options=channel_options(max_receive_bytes), maximum_concurrent_rpcs=max_concurrent_rpcs)
    register(server)
    health_servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    reflection.enable_server_reflection([*service_names, health.SERVICE_NAME, reflection.SERVICE_NAME], server)
    bind = join_host_port(host, port)
    bound = server.add_secure_port(bind, credentials) if credentials is not None else server.add_insecure_port(bind)
    if bound == 0:
        raise OSError(f"cannot bind {bind}")
    server.start()
    for name in ["", *service_names]:
        health_servicer.set(name, health_pb2.HealthCheckResponse.SERVING)
    return RunningServer(server, bound, health_servicer, tuple(service_names), advertised_host(host, advertise_host))


@dataclass(frozen=True)
class Drain:
    """How a server drains on SIGTERM: `begin()` makes it refuse new work (UNAVAILABLE), `num_running()`
    counts the work it accepted and has not finished; it waits for that to reach 0 or `timeout_s`."""
    begin: Callable[[], None]
    num_running: Callable[[], int]
    timeout_s: float


def drain(running: RunningServer, kind: str, plan: Drain, interrupted: threading.Event) -> None:
    """Refuse new work, health NOT_SERVING (routers and probes stop sending), wait for running work. In
    that order: whoever sees NOT_SERVING can count on admissions being refused already (a request that
    comes in between is refused as UNAVAILABLE, which a router places again elsewhere)."""
    start = time.monotonic()
    plan.begin()
    running.set_serving(False)
    left = plan.num_running()
    print(f"specdec {kind} draining: {left} running, waiting up to {plan.timeout_s:g} s", flush=True)
    while left and time.monotonic() - start < plan.timeout_s and not interrupted.wait(0.05):
        left = plan.num_running()
    elapsed = time.monotonic() - start
    print(f"specdec {kind} drained in {elapsed:.2f} s" if not left else
          f"specdec {kind} stops after {elapsed:.2f} s of draining with {left} still running", flush=True)


def freeze_heap() -> None:
    """Move everything alive now (the model, tokenizer, torch and transformers' own objects: ~370k for
    SmolLM2) out of the garbage collector's sight. Its collections otherwise walk all of them again and
    again while serving (~3% of a decode step's time here, profiled, and a pause whenever a full
    collection falls in a step); what a server loads stays for its whole life, so none of it is garbage to
    find. Objects made later are collected as before. For long-lived server processes only: a process
    that builds and drops models (tests, benchmarks) would keep the dropped ones' cycles for good."""
    gc.collect()
    gc.freeze()


def wait_for_signal(stop: threading.Event) -> None:
    """Until a signal handler sets `stop`, waiting in short slices: a process-wide SIGTERM may be delivered
    to any thread (gRPC's, torch's), and then only sets Python's pending flag; the main thread runs the
    handler when it next returns to bytecode, which an untimed wait would put off until something else woke
    it (make test once saw a target answer SERVING for 10 s after SIGTERM)."""
    while not stop.wait(0.1):
        pass


def run_until_signalled(running: RunningServer, kind: str, on_stop: Callable[[], None] | None = None,
                        ready_detail: str = "", telemetry=None, drain_plan: Drain | None = None) -> int:
    """Print the ready line (what `specdec serve` and tests wait for), then block until SIGTERM/SIGINT.
    `ready_detail` is appended to it (the router's HTTP address), then the Prometheus endpoint's
    address if `telemetry` (specdec.telemetry.Telemetry) serves one; its spans are flushed at the end.
    With `drain_plan` the first signal drains (see `drain`); a second one stops at once."""
    stop, interrupted = threading.Event(), threading.Event()

    def on_signal(*_) -> None:
        (interrupted if stop.is_set() else stop).set()

    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, on_signal)
    freeze_heap()  # loading is done: what is alive now lives as long as the server
    metrics = getattr(getattr(telemetry, "metrics", None), "address", "")
    print(f"specdec {kind} ready on {running.address}{ready_detail}" + (f"; metrics on {metrics}" if metrics else ""),
          flush=True)
    wait_for_signal(stop)
    if drain_plan is not None:
        drain(running, kind, drain_plan, interrupted)
    if on_stop is not None:
        on_stop()
    running.stop()
    if telemetry is not None:
        telemetry.shutdown()
    sys.stdout.flush()
    return 0
