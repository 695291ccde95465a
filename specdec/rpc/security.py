"""A SecurityConfig as gRPC credentials: server credentials, the token check, and channels that
present this process's certificate and token to the servers it calls.

Every channel in the project opens here (router -> target, router -> draft, draft -> target, the
client SDK), so a peer is authenticated the same way wherever it is dialled from. Health checks and
reflection stay outside the token check (probes carry no secret); with mutual TLS the handshake
itself already shut out a peer without a certificate signed by the CA, on every method.
"""
from __future__ import annotations

import collections
import hmac

import grpc

from specdec.errors import InvalidArgument
from specdec.security_config import SecurityConfig, read_secret

OPEN_PREFIXES = ("/grpc.health.v1.Health/", "/grpc.reflection.")  # callable without a token
TOKEN_MISSING = "this server needs the internal token: send metadata 'authorization: Bearer TOKEN'"


def _pem(path: str | None, what: str) -> bytes | None:
    return read_secret(path, what).encode() if path else None


def server_credentials(security: SecurityConfig, require_client_auth: bool) -> grpc.ServerCredentials | None:
    """TLS for a server (None = plaintext). `require_client_auth`: the worker's internal port demands a
    client certificate signed by tls_ca_file (mutual TLS); the router's public port does not."""
    if not security.tls:
        return None
    if not security.tls_cert_file:
        raise InvalidArgument("security: a server needs tls_cert_file and tls_key_file to use TLS "
                              "(tls_ca_file alone only lets a client check servers)")
    ca = _pem(security.tls_ca_file, "tls_ca_file")
    return grpc.ssl_server_credentials(
        [(_pem(security.tls_key_file, "tls_key_file"), _pem(security.tls_cert_file, "tls_cert_file"))],
        root_certificates=ca, require_client_auth=require_client_auth and ca is not None)


def channel_credentials(security: SecurityConfig) -> grpc.ChannelCredentials | None:
    """TLS for a client (None = plaintext): trusts tls_ca_file (or the system's roots) and presents this
    process's certificate when it has one."""
    if not security.tls:
        return None
    return grpc.ssl_channel_credentials(root_certificates=_pem(security.tls_ca_file, "tls_ca_file"),
                                        private_key=_pem(security.tls_key_file, "tls_key_file"),
                                        certificate_chain=_pem(security.tls_cert_file, "tls_cert_file"))


def tls_options(security: SecurityConfig) -> list[tuple[str, str]]:
    return [("grpc.ssl_target_name_override", security.tls_server_name)] if security.tls and \
        security.tls_server_name else []


def open_channel(address: str, security: SecurityConfig, options: list | None = None) -> grpc.Channel:
    """A channel to `address` with this process's credentials: TLS (and certificate) and/or the token."""
    options = [*(options or []), *tls_options(security)]
    credentials = channel_credentials(security)
    channel = grpc.secure_channel(address, credentials, options) if credentials is not None \
        else grpc.insecure_channel(address, options)
    token = security.token()
    return grpc.intercept_channel(channel, BearerToken(token)) if token else channel


class _Details(collections.namedtuple("_Details", ("method", "timeout", "metadata", "credentials",
                                                   "wait_for_ready", "compression")), grpc.ClientCallDetails):
    pass


class BearerToken(grpc.UnaryUnaryClientInterceptor, grpc.UnaryStreamClientInterceptor,
                  grpc.StreamUnaryClientInterceptor, grpc.StreamStreamClientInterceptor):
    """Adds `authorization: Bearer TOKEN` to every call of a channel."""

    def __init__(self, token: str):
        self.header = ("authorization", f"Bearer {token}")

    def _details(self, details):
        metadata = [m for m in (details.metadata or ()) if m[0] != "authorization"] + [self.header]
        return _Details(details.method, details.timeout, metadata, details.credentials,
                        getattr(details, "wait_for_ready", None), getattr(details, "compression", None))

    def intercept_unary_unary(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_unary_stream(self, continuation, details, request):
        return continuation(self._details(details), request)

    def intercept_stream_unary(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)

    def intercept_stream_stream(self, continuation, details, request_iterator):
        return continuation(self._details(details), request_iterator)


def bearer(metadata) -> str:
    """The token of an `authorization: Bearer TOKEN` entry ("" if none)."""
    scheme, _, token = (dict(metadata or ()).get("authorization") or "").strip().partition(" ")
    return token.strip() if scheme.lower() == "bearer" else ""


class TokenInterceptor(grpc.ServerInterceptor):
    """Refuses every call without the shared token (UNAUTHENTICATED), health and reflection excepted."""

    def __init__(self, token: str):
        self.token = token.encode()

    def intercept_service(self, continuation, handler_call_details):
        handler = continuation(handler_call_details)
        if handler is None or handler_call_details.method.startswith(OPEN_PREFIXES):
            return handler
        given = bearer(handler_call_details.invocation_metadata)
        if given and hmac.compare_digest(given.encode(), self.token):
            return handler
        return refusing(handler, TOKEN_MISSING if not given else "invalid internal token")


def refusing(handler: grpc.RpcMethodHandler, message: str) -> grpc.RpcMethodHandler:
    """A handler of the same shape as `handler` that ends the call with UNAUTHENTICATED."""
    def refuse(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)

    def refuse_stream(request_or_iterator, context):
        context.abort(grpc.StatusCode.UNAUTHENTICATED, message)
        yield  # never reached: makes this a generator, as a streaming handler must be

    serdes = (handler.request_deserializer, handler.response_serializer)
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(refuse, *serdes)
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(refuse_stream, *serdes)
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(refuse, *serdes)
    return grpc.stream_stream_rpc_method_handler(refuse_stream, *serdes)
