"""API keys for both of the router's doors: the OpenAI-compatible HTTP API and the gRPC Generation service.

Keys come from `router.api_keys_file` (`--api-keys-file`: one key per line; blank lines and `#`
comments are skipped) and from the environment variable SPECDEC_API_KEYS (comma-separated). With no
key configured nothing is checked, which suits a stack bound to 127.0.0.1; with any key, every call
must carry `Authorization: Bearer KEY` (an HTTP header, or gRPC metadata `authorization`) or it is
refused: HTTP 401 in OpenAI's error shape, gRPC UNAUTHENTICATED. Health checks (`/health`, gRPC
health) and reflection stay open so that probes need no secret. Keys are compared in constant time.

Admin keys (`router.admin_keys_file`, SPECDEC_ADMIN_KEYS) are API keys that also see GetServerInfo's
details: worker addresses, sequence ids and user names. Without an admin key those are withheld
whenever any admin key or a security section is configured; a local stack with neither shows them
to anyone, as before.
"""
from __future__ import annotations

import hmac
import os
from dataclasses import dataclass
from typing import Mapping

import grpc

from specdec.errors import Unauthenticated
from specdec.rpc.security import refusing
from specdec.security_config import ADMIN_KEYS_ENV as ENV_ADMIN_KEYS
from specdec.security_config import API_KEYS_ENV as ENV_KEYS
from specdec.security_config import read_keys

PROTECTED_PREFIX = "/specdec.v1.Generation/"  # gRPC methods that need a key


def _bearer(authorization: str | None) -> str | None:
    scheme, _, token = (authorization or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" and token.strip() else None


def _among(token: str | None, keys: tuple[str, ...]) -> bool:
    return token is not None and any(hmac.compare_digest(token.encode(), key.encode()) for key in keys)


@dataclass(frozen=True)
class ApiKeys:
    keys: tuple[str, ...] = ()
    admin_keys: tuple[str, ...] = ()
    # Details are withheld from non-admins even with no admin key configured (a security section is).
    secured: bool = False

    @classmethod
    def load(cls, path: str | None, environ: Mapping[str, str] = os.environ, admin_path: str | None = None,
             secured: bool = False) -> ApiKeys:
        return cls(read_keys(path, ENV_KEYS, "api_keys_file", environ),
                   read_keys(admin_path, ENV_ADMIN_KEYS, "admin_keys_file", environ), secured)

    @property
    def enabled(self) -> bool:
        """Whether calls need a key (any API key configured; admin keys alone leave generation open)."""
        return bool(self.keys)

    def check(self, authorization: str | None) -> None:
        """Raise Unauthenticated unless `authorization` is "Bearer <a configured key>" (an admin key counts)
        or no API key is configured."""
        if not self.keys:
            return
        token = _bearer(authorization)
        if token is None:
            raise Unauthenticated("this server needs an API key: send the header 'Authorization: Bearer KEY'")
        if not _among(token, self.keys + self.admin_keys):
            raise Unauthenticated("invalid API key")

    def shows_details(self, authorization: str | None) -> bool:
        """Whether this caller may see worker addresses, sequence ids and users (GetServerInfo)."""
        if _among(_bearer(authorization), self.admin_keys):
            return True
        return not self.admin_keys and not self.secured


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
            return refusing(handler, str(exc))
