"""Client SDK for a running router: sync (`Client`) and asyncio (`AsyncClient`), streaming or not.

    from specdec.client import Client
    with Client("127.0.0.1:50051") as client:
        for chunk in client.stream("Write a haiku", SamplingParams(max_new_tokens=32)):
            print(chunk.text, end="")
        out = client.generate([1, 2, 3])          # GenerationOutput, as Engine.generate returns

Errors come back as the specdec error of their status (InvalidArgument, ResourceExhausted,
DeadlineExceeded, ...). A router that requires API keys gets `api_key=` (default: env SPECDEC_API_KEY)
as `authorization: Bearer KEY` metadata; one that serves TLS gets `security=` (a SecurityConfig: the
CA to trust, the name to expect). `Client(address, **client_options(load_stack_config(FILE)))`
presents what a deployment file provides. No torch is imported.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from typing import AsyncIterator, Iterator

import grpc

from specdec.core.types import GenerationOutput, SamplingParams
from specdec.rpc.convert import params_to_pb, prompt_to_pb, stats_from_pb
from specdec.rpc.security import channel_credentials, tls_options
from specdec.rpc.server import channel_options
from specdec.rpc.status import to_exception
from specdec.rpc.v1 import generation_pb2, generation_pb2_grpc
from specdec.security_config import ADMIN_KEYS_ENV, API_KEYS_ENV, SecurityConfig, read_keys


API_KEY_ENV = "SPECDEC_API_KEY"


def client_options(stack) -> dict:
    """Client keyword arguments from a deployment (specdec.serving_config.StackConfig): its security
    section (the CA that signed the router's certificate), and an API key: env SPECDEC_API_KEY, else the
    first of the router's API keys, else the first admin key (None when it configures none)."""
    router = stack.router
    keys = (os.environ.get(API_KEY_ENV) or None,
            *read_keys(router.api_keys_file, API_KEYS_ENV, "api_keys_file"),
            *read_keys(router.admin_keys_file, ADMIN_KEYS_ENV, "admin_keys_file"))
    return {"api_key": next((k for k in keys if k), None), "security": stack.security}


def _channel(address: str, security: SecurityConfig | None, aio: bool = False):
    security = security or SecurityConfig()
    options = [*channel_options(), *tls_options(security)]
    credentials = channel_credentials(security)
    module = grpc.aio if aio else grpc
    if credentials is None:
        return module.insecure_channel(address, options=options)
    return module.secure_channel(address, credentials, options=options)


@dataclass(frozen=True)
class StreamChunk:
    """One streamed step (like the engine's StreamEvent); the last one carries `output`."""

    text: str
    token_ids: list[int]
    output: GenerationOutput | None = None


def _request(prompt, params: SamplingParams | None, chat: bool, user: str) -> generation_pb2.GenerateRequest:
    request = generation_pb2.GenerateRequest(chat=chat, params=params_to_pb(params or SamplingParams()), user=user)
    prompt_to_pb(request, prompt)
    return request


def _metadata(api_key: str | None) -> tuple:
    key = os.environ.get(API_KEY_ENV) if api_key is None else api_key
    return (("authorization", f"Bearer {key}"),) if key else ()


def _chunk(response: generation_pb2.GenerateResponse, token_ids: list[int]) -> StreamChunk:
    ids = list(response.token_ids)
    token_ids.extend(ids)
    output = None
    if response.HasField("final"):
        final = response.final
        output = GenerationOutput(list(token_ids), final.text, stats_from_pb(final.stats), final.finish_reason,
                                  list(final.prompt_token_ids))
    return StreamChunk(response.text, ids, output)


class Client:
    def __init__(self, address: str, api_key: str | None = None, security: SecurityConfig | None = None):
        self.channel = _channel(address, security)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.metadata = _metadata(api_key)

    def stream(self, prompt, params: SamplingParams | None = None, chat: bool = False,
               timeout_s: float | None = None, user: str = "") -> Iterator[StreamChunk]:
        """Yields chunks as the router streams them; closing the iterator cancels the request.

        `user` names who asks, for the router's fair queueing ("" = this connection)."""
        call = self.stub.Generate(_request(prompt, params, chat, user), timeout=timeout_s, metadata=self.metadata)
        token_ids: list[int] = []
        try:
            for response in call:
                yield _chunk(response, token_ids)
        except grpc.RpcError as exc:
            raise to_exception(exc) from None
        finally:
            call.cancel()

    def generate(self, prompt, params: SamplingParams | None = None, chat: bool = False,
                 timeout_s: float | None = None, user: str = "") -> GenerationOutput:
        for chunk in self.stream(prompt, params, chat, timeout_s, user):
            if chunk.output is not None:
                return chunk.output
        raise _missing_final()

    def server_info(self, timeout_s: float = 10.0) -> generation_pb2.ServerInfo:
        try:
            return self.stub.GetServerInfo(generation_pb2.GetServerInfoRequest(), timeout=timeout_s,
                                           metadata=self.metadata)
        except grpc.RpcError as exc:
            raise to_exception(exc) from None

    def wait_ready(self, timeout_s: float = 30.0) -> None:
        grpc.channel_ready_future(self.channel).result(timeout=timeout_s)

    def close(self) -> None:
        self.channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class AsyncClient:
    """The same calls for asyncio (grpc.aio); create it inside a running event loop."""

    def __init__(self, address: str, api_key: str | None = None, security: SecurityConfig | None = None):
        self.channel = _channel(address, security, aio=True)
        self.stub = generation_pb2_grpc.GenerationStub(self.channel)
        self.metadata = _metadata(api_key)

    async def stream(self, prompt, params: SamplingParams | None = None, chat: bool = False,
                     timeout_s: float | None = None, user: str = "") -> AsyncIterator[StreamChunk]:
        call = self.stub.Generate(_request(prompt, params, chat, user), timeout=timeout_s, metadata=self.metadata)
        token_ids: list[int] = []
        try:
            async for response in call:
                yield _chunk(response, token_ids)
        except grpc.RpcError as exc:
            raise to_exception(exc) from None
        finally:
            call.cancel()

    async def generate(self, prompt, params: SamplingParams | None = None, chat: bool = False,
                       timeout_s: float | None = None, user: str = "") -> GenerationOutput:
        async for chunk in self.stream(prompt, params, chat, timeout_s, user):
            if chunk.output is not None:
                return chunk.output
        raise _missing_final()

    async def server_info(self, timeout_s: float = 10.0) -> generation_pb2.ServerInfo:
        try:
            return await self.stub.GetServerInfo(generation_pb2.GetServerInfoRequest(), timeout=timeout_s,
                                                 metadata=self.metadata)
        except grpc.RpcError as exc:
            raise to_exception(exc) from None

    async def close(self) -> None:
        await self.channel.close()

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()


def _missing_final():
    from specdec.errors import ServerError

    return ServerError("the stream ended without a final message")
