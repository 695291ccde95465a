"""API keys for both of the router's doors: the OpenAI-compatible HTTP API and the gRPC Generation service.

Keys come from `router.api_keys_file` (`--api-keys-file`: one key per line; blank lines and `#`
comments are skipped) and from the environment variable SPECDEC_API_KEYS (comma-separated). With no
key configured nothing is checked, which suits a stack bound to 127.0.0.1; with any key, every call
must carry `Authorization: Bearer KEY` (an HTTP header, or gRPC metadata `authorization`) or it is
refused: HTTP 401 in OpenAI's error shape, gRPC UNAUTHENTICATED. Health checks (`/health`, gRPC
health) and reflection stay open so that probes need no secret. Keys are compared in constant time.
"""
from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

import grpc

from specdec.errors import InvalidArgument, Unauthenticated

ENV_KEYS = "SPECDEC_API_KEYS"
PROTECTED_PREFIX = "/specdec.v1.Generation/"  # gRPC methods that need a key


@dataclass(frozen=True)
class ApiKeys:
    keys: tuple[str, ...] = ()

    @classmethod
    def load(cls, path: str | None, environ: Mapping[str, str] = os.environ) -> ApiKeys:
        keys = [k.strip() for k in environ.get(ENV_KEYS, "").split(",") if k.strip()]
        if path:
            try:
                lines = Path(path).read_text().splitlines()
            except OSError as exc:
                raise InvalidArgument(f"cannot read api_keys_file {path!r}: {exc}") from exc
            from_file = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
            if not from_file:  # an empty file must not silently switch the check off
                raise InvalidArgument(f"api_keys_file {path!r} holds no key")
            keys += from_file
        return cls(tuple(keys))

    @property
    def enabled(self) -> bool:
        return bool(self.keys)

    def check(self, authorization: str | None) -> None:
        """Raise Unauthenticated unless `authorization` is "Bearer <a configured key>" (or no key is configured)."""
        if not self.keys:
            return
        scheme, _, token = (authorization or "").strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("this server needs an API key: send the header 'Authorization: Bearer KEY'")
        token = token.strip().encode()
        if not any(hmac.compare_digest(token, key.encode()) for key in self.keys):
            raise Unauthenticated("invalid API key")


class ApiKeyInterceptor(grpc.ServerInterceptor):
    """Refuses Generation calls without a valid key with UNAUTHENTICATED; other services pass."""

    def __init__(self, keys: ApiKeys):
        self.keys = keys

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or not handler_call_details.method.startswith(PROTECTED_PREFIX):
            return handler
        try:
            self.keys.check(dict(handler_call_details.invocation_metadata).get("authorization"))
            return handler
        except Unauthenticated as exc:
            message = str(exc)

        def refuse(request, context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

        if handler.unary_stream:
            return grpc.unary_stream_rpc_method_handler(refuse, handler.request_deserializer,
                                                        handler.response_serializer)
        return grpc.unary_unary_rpc_method_handler(refuse, handler.request_deserializer, handler.response_serializer)
