"""The router's OpenAI-compatible HTTP API: a Starlette app served by uvicorn on a thread of the router.

Why a thread in the router process rather than a separate gateway: the dispatcher's admission
(one fair queue, one KV ledger, one count of running generations) and worker pools are plain
objects behind a lock; serving HTTP in the same process lets an HTTP request wait in exactly the
queue a gRPC request waits in and run in the same batches, with no second copy of that state to
keep in step. The event loop never blocks: each generation runs on its own thread (as a gRPC call
runs on the gRPC server's pool) and hands each commit to the loop. These threads are bounded by
admission itself: beyond `max_active` running and `max_queue` waiting, a request is refused (429)
at once and its thread ends.

Endpoints: POST /v1/completions, POST /v1/chat/completions (`stream: true`: server-sent events ending
in `data: [DONE]`), GET /v1/models, GET /health. A client's deadline is the request header
`X-Timeout-S` (seconds; 504 when it passes). A client that disconnects cancels its generation, which
releases the sequence at every worker. Errors have OpenAI's shape and the status a client expects.
"""
from __future__ import annotations

import asyncio
import json
import logging
import math
import os
import socket
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator

import grpc
import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, StreamingResponse
from starlette.routing import Route

from router.api_keys import ApiKeys
from router.dispatcher import Dispatcher
from router.http_call import HttpCall, cancel_on_disconnect, generations
from router.openai_schema import SSE_DONE, ApiError, ResponseBuilder, bad_request, parse_request, sse
from specdec.errors import Unauthenticated, Unavailable
from specdec.rpc.status import status_of
from specdec.security_config import LOOPBACK, SecurityConfig, advertised_host, join_host_port

log = logging.getLogger(__name__)
TIMEOUT_HEADER = "x-timeout-s"
STARTUP_TIMEOUT_S = 10.0
STATUS_OF_CODE = {  # gRPC status of the dispatcher's error -> (HTTP status, OpenAI error type)
    grpc.StatusCode.INVALID_ARGUMENT: (400, "invalid_request_error"),
    grpc.StatusCode.UNAUTHENTICATED: (401, "authentication_error"),
    grpc.StatusCode.NOT_FOUND: (404, "invalid_request_error"),
    grpc.StatusCode.RESOURCE_EXHAUSTED: (429, "rate_limit_error"),
    grpc.StatusCode.CANCELLED: (499, "cancelled"),
    grpc.StatusCode.UNAVAILABLE: (503, "server_error"),
    grpc.StatusCode.DEADLINE_EXCEEDED: (504, "timeout_error"),
}
JSON_EXPANSION = 6  # JSON may spell one byte of text as six (\u0001): a valid request's largest body
PARAM_OF_MESSAGE = {"temperature": "temperature", "top_p": "top_p", "top_k": "top_k", "seed": "seed",
                    "max_new_tokens": "max_tokens", "stop": "stop", "user": "user", "prompt": "prompt",
                    "chat": "messages"}


def api_error(exc: BaseException, chat: bool) -> ApiError:
    if isinstance(exc, ApiError):
        return exc
    code, message = status_of(exc)
    status, type_ = STATUS_OF_CODE.get(code, (500, "server_error"))
    if status == 500:
        log.error("generation failed: %s", message)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED and isinstance(exc, grpc.RpcError):  # a worker call's own words
        message = "the deadline (header X-Timeout-S) passed before the generation finished"
    param = next((p for prefix, p in PARAM_OF_MESSAGE.items() if message.startswith(prefix)), None)
    if param == "prompt" and chat:
        param = "messages"
    return ApiError(status, message, type_, param if status == 400 else None, code.name.lower())


def error_response(error: ApiError) -> JSONResponse:
    headers = {"retry-after": "1"} if error.status in (429, 503) else None
    return JSONResponse(error.body(), status_code=error.status, headers=headers)


class _EventStream(StreamingResponse):
    """Server-sent events; however the response ends (done, client gone, error), the generation is cancelled."""

    def __init__(self, content, call: HttpCall):
        super().__init__(content, media_type="text/event-stream",
                         headers={"cache-control": "no-cache", "x-accel-buffering": "no"})
        self.call = call

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.call.cancel()


class OpenAIApp:
    def __init__(self, dispatcher: Dispatcher, keys: ApiKeys):
        self.dispatcher, self.keys = dispatcher, keys
        self.model_id = os.path.basename(os.path.normpath(dispatcher.target_info.model_path)) or "model"
        self.created = int(time.time())
        self.app = Starlette(routes=[
            Route("/v1/completions", self.completions, methods=["POST"]),
            Route("/v1/chat/completions", self.chat_completions, methods=["POST"]),
            Route("/v1/models", self.models, methods=["GET"]),
            Route("/health", self.health, methods=["GET"]),
        ])

    async def completions(self, request: Request):
        return await self._generate(request, chat=False)

    async def chat_completions(self, request: Request):
        return await self._generate(request, chat=True)

    async def models(self, request: Request):
        try:
            self.keys.check(request.headers.get("authorization"))
        except Unauthenticated as exc:
            return error_response(api_error(exc, False))
        return JSONResponse({"object": "list", "data": [{
            "id": self.model_id, "object": "model", "created": self.created, "owned_by": "specdec",
            "max_model_len": self.dispatcher.target_info.max_context_len}]})

    async def health(self, request: Request):
        if self.dispatcher.any_target_healthy():
            return JSONResponse({"status": "ok"})
        reason = "the router is draining" if self.dispatcher.draining else "no healthy target worker"
        return error_response(api_error(Unavailable(reason), False))

    async def _generate(self, request: Request, chat: bool):
        try:
            self.keys.check(request.headers.get("authorization"))
            body = await _read_json(request, JSON_EXPANSION * self.dispatcher.limits.max_request_bytes)
            parsed = parse_request(body, chat, self.model_id)
            timeout_s = _timeout_s(request.headers.get(TIMEOUT_HEADER))
        except Exception as exc:  # noqa: BLE001 - every refusal gets OpenAI's error shape
            return error_response(api_error(exc, chat))
        client = request.client
        call = HttpCall(f"http:{client.host}:{client.port}" if client else "http:unknown", timeout_s)
        events = generations(self.dispatcher, parsed, call)
        watcher = asyncio.ensure_future(cancel_on_disconnect(request.receive, call))
        try:
            first = await anext(events)  # queue, prefill and first commit: errors up to here get a status
            responses = [first] if parsed.stream else [first] + [r async for r in events]
        except Exception as exc:  # noqa: BLE001
            return error_response(api_error(exc, chat))
        finally:
            watcher.cancel()
        builder = ResponseBuilder(parsed)
        if not parsed.stream:
            return JSONResponse(builder.complete(responses))
        return _EventStream(_events(builder, first, events, chat), call)


async def _events(builder: ResponseBuilder, first, events: AsyncIterator, chat: bool) -> AsyncIterator[bytes]:
    for chunk in builder.first_chunks():
        yield sse(chunk)
    try:
        for chunk in builder.chunks(first):
            yield sse(chunk)
        async for response in events:
            for chunk in builder.chunks(response):
                yield sse(chunk)
    except Exception as exc:  # noqa: BLE001 - after the 200 the error travels as an event
        yield sse(api_error(exc, chat).body())
    yield SSE_DONE


async def _read_json(request: Request, max_bytes: int):
    """The JSON body, refused (413) as soon as it is known to be larger than any valid request can be."""
    length = request.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise _too_large(length, max_bytes)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > max_bytes:
            raise _too_large(f"more than {max_bytes}", max_bytes)
    try:
        return json.loads(body)
    except ValueError:
        raise bad_request("the request body is not valid JSON", None) from None


def _too_large(size: str, max_bytes: int) -> ApiError:
    return ApiError(413, f"the request body is {size} bytes; the limit is {max_bytes} (max_prompt_bytes and the "
                    f"other request limits, as JSON)",
                    code="request_too_large")


def _timeout_s(header: str | None) -> float | None:
    if header is None:
        return None
    try:
        value = float(header)
    except ValueError:
        value = math.nan
    if not value > 0 or math.isinf(value):
        raise bad_request(f"header X-Timeout-S must be a positive number of seconds, got {header!r}", None)
    return value


@dataclass
class HttpServer:
    server: uvicorn.Server
    thread: threading.Thread
    address: str

    def stop(self, timeout_s: float = 5.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)


def start_http(dispatcher: Dispatcher, keys: ApiKeys, port: int, host: str = LOOPBACK,
               advertise_host: str | None = None, security: SecurityConfig = SecurityConfig()) -> HttpServer:
    """Bind (port 0 = any free port), serve on a daemon thread, return once it accepts connections.
    With a certificate in the security section it serves HTTPS, as the gRPC port serves TLS."""
    name = host.strip("[]")
    sock = socket.socket(socket.AF_INET6 if ":" in name else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((name, port))
    except OSError as exc:
        sock.close()
        raise Unavailable(f"cannot bind the HTTP API to {host}:{port}: {exc}") from exc
    tls = security.tls and security.tls_cert_file
    config = uvicorn.Config(OpenAIApp(dispatcher, keys).app, http="h11", loop="asyncio", lifespan="off",
                            log_level="warning", access_log=False, timeout_graceful_shutdown=2,
                            ssl_certfile=security.tls_cert_file if tls else None,
                            ssl_keyfile=security.tls_key_file if tls else None)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="http-api", daemon=True)
    thread.start()
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while not server.started:
        if not thread.is_alive() or time.monotonic() > deadline:
            raise Unavailable("the HTTP API did not start")
        time.sleep(0.01)
    return HttpServer(server, thread, join_host_port(advertised_host(host, advertise_host), sock.getsockname()[1]))
