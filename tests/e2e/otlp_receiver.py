"""A real OTLP trace receiver on 127.0.0.1 for tests: the collector's gRPC TraceService, built from the
opentelemetry-proto package's stubs, keeping every export in memory."""
from __future__ import annotations

import contextlib
import threading
from concurrent import futures

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc

from specdec.telemetry_export import otlp_json
from specdec.trace_report import Span, spans_from_otlp


class TraceReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self):
        self.lock = threading.Lock()
        self.requests: list = []  # ExportTraceServiceRequest, in arrival order

    def Export(self, request, context):
        with self.lock:
            self.requests.append(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(self) -> list[Span]:
        with self.lock:
            requests = list(self.requests)
        return [span for request in requests for span in spans_from_otlp(otlp_json(request))]


@contextlib.contextmanager
def otlp_receiver():
    """(receiver, "127.0.0.1:PORT") while the block runs."""
    receiver = TraceReceiver()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(receiver, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield receiver, f"127.0.0.1:{port}"
    finally:
        server.stop(0)
