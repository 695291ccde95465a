"""One place that maps errors to gRPC status codes and back.

Servicers raise specdec errors (or let a downstream grpc.RpcError through); `StatusInterceptor`
turns them into a status with the error's one-line message, so no servicer calls `context.abort`
itself and a bug surfaces as INTERNAL instead of a hung stream. Clients use `to_exception` to get
the same specdec error class back.
"""
from __future__ import annotations

import logging

import grpc

from specdec import errors

log = logging.getLogger(__name__)

CODES = (  # most specific first: DeadlineExceeded is also a TimeoutError, ModelNotFound a FileNotFoundError
    (errors.InvalidArgument, grpc.StatusCode.INVALID_ARGUMENT),
    (errors.ModelNotFound, grpc.StatusCode.NOT_FOUND),
    (errors.Unauthenticated, grpc.StatusCode.UNAUTHENTICATED),
    (errors.PermissionDenied, grpc.StatusCode.PERMISSION_DENIED),
    (errors.ResourceExhausted, grpc.StatusCode.RESOURCE_EXHAUSTED),
    (errors.Unavailable, grpc.StatusCode.UNAVAILABLE),
    (errors.DeadlineExceeded, grpc.StatusCode.DEADLINE_EXCEEDED),
    (errors.Cancelled, grpc.StatusCode.CANCELLED),
    (errors.Internal, grpc.StatusCode.INTERNAL),
)


def status_of(exc: BaseException) -> tuple[grpc.StatusCode, str]:
    if isinstance(exc, grpc.RpcError) and hasattr(exc, "code"):  # a downstream call failed: pass it on
        return exc.code(), exc.details() or exc.code().name
    for cls, code in CODES:
        if isinstance(exc, cls):
            return code, str(exc)
    return grpc.StatusCode.INTERNAL, f"internal error: {type(exc).__name__}: {exc}"


def to_exception(exc: grpc.RpcError) -> errors.SpecdecError:
    """A client-side RpcError as the specdec error a caller can catch."""
    code, details = exc.code(), exc.details() or ""
    for cls, mapped in CODES:
        if code == mapped:
            return cls(details or code.name.lower())
    return errors.ServerError(f"{code.name}: {details}")


def _abort(context: grpc.ServicerContext, exc: BaseException):
    code, message = status_of(exc)
    if code == grpc.StatusCode.INTERNAL:
        log.exception("unexpected error in a servicer", exc_info=exc)
    context.abort(code, message)


class Unparsable:
    """A request message that did not parse (say, a string field that is not UTF-8). gRPC itself would
    answer it with INTERNAL ("Exception deserializing request!"), which reads as a server fault; the
    handler answers INVALID_ARGUMENT with the parser's reason instead."""

    def __init__(self, reason: str):
        self.reason = reason


def _lenient(deserialize):
    if deserialize is None:
        return None

    def parse(data: bytes):
        try:
            return deserialize(data)
        except Exception as exc:  # noqa: BLE001 - whatever the parser raises, the message is malformed
            return Unparsable(f"{type(exc).__name__}: {exc}")
    return parse


def _refuse_unparsable(request, context) -> None:
    if isinstance(request, Unparsable):
        context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"the request message does not parse: {request.reason}")


def _wrap_unary(behavior):
    def handler(request_or_iterator, context):
        _refuse_unparsable(request_or_iterator, context)
        try:
            return behavior(request_or_iterator, context)
        except Exception as exc:  # noqa: BLE001 - the point of this interceptor
            if not context.is_active():
                raise
            _abort(context, exc)
    return handler


def _wrap_stream(behavior):
    def handler(request_or_iterator, context):
        _refuse_unparsable(request_or_iterator, context)
        try:
            yield from behavior(request_or_iterator, context)
        except Exception as exc:  # noqa: BLE001
            if not context.is_active():
                return
            _abort(context, exc)
    return handler


class StatusInterceptor(grpc.ServerInterceptor):
    """Maps exceptions raised by any handler (unary or streaming) to status codes."""

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None:
            return None
        if handler.unary_unary:  # a single request message: one that does not parse is INVALID_ARGUMENT
            return grpc.unary_unary_rpc_method_handler(
                _wrap_unary(handler.unary_unary), _lenient(handler.request_deserializer), handler.response_serializer)
        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(
                _wrap_stream(handler.unary_stream), _lenient(handler.request_deserializer),
                handler.response_serializer)
        if handler.stream_unary:
            return grpc.stream_unary_rpc_method_handler(
                _wrap_unary(handler.stream_unary), handler.request_deserializer, handler.response_serializer)
        return grpc.stream_stream_rpc_method_handler(
            _wrap_stream(handler.stream_stream), handler.request_deserializer, handler.response_serializer)
