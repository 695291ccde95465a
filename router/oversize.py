"""Refusing an oversized GenerateRequest by its size on the wire, before it is parsed.

gRPC reads a request up to the router's message limit (router.limits: at least 32 MiB) so that an
oversized one gets the router's own INVALID_ARGUMENT naming the limit rather than gRPC's bare
RESOURCE_EXHAUSTED. Parsing it would cost several times its size (the protobuf message, then the
prompt as a Python string) only to learn that it is too large; its serialized size already says so:
no valid request is larger than `RequestLimits.max_request_bytes`. So a larger one is refused here,
from its byte count alone, and only requests that could be valid are parsed and checked field by
field (router.limits.check_request).
"""
from __future__ import annotations

import grpc

from router.limits import RequestLimits

GENERATE = "/specdec.v1.Generation/Generate"


class Oversized:
    """Stands in for a request too large to be valid (never parsed)."""

    def __init__(self, num_bytes: int):
        self.num_bytes = num_bytes


class OversizeInterceptor(grpc.ServerInterceptor):
    def __init__(self, limits: RequestLimits):
        self.limits = limits

    def refusal(self, num_bytes: int) -> str:
        limits = self.limits
        return (f"prompt: the request is {num_bytes} bytes, more than any valid request can be "
                f"({limits.max_request_bytes} bytes); the limit is {limits.max_prompt_bytes} (max_prompt_bytes), "
                f"with at most {limits.max_stop_strings} stop strings of {limits.max_stop_bytes} bytes "
                f"(max_stop_strings, max_stop_bytes)")

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method != GENERATE or not handler.unary_stream:
            return handler
        parse, behavior, largest = handler.request_deserializer, handler.unary_stream, self.limits.max_request_bytes

        def deserialize(data: bytes):
            return Oversized(len(data)) if len(data) > largest else parse(data)

        def refuse_or_serve(request, context):
            if isinstance(request, Oversized):
                context.abort(grpc.StatusCode.INVALID_ARGUMENT, self.refusal(request.num_bytes))
            yield from behavior(request, context)

        return grpc.unary_stream_rpc_method_handler(refuse_or_serve, deserialize, handler.response_serializer)
