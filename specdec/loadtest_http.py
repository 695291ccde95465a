"""The load test's HTTP transport: streamed chat completions against the router's OpenAI-compatible API.

Standard library only (http.client, one keep-alive connection per simulated user), so the load test
needs nothing the package does not already install. Each request asks for the token ids of every
chunk (`return_token_ids`) to count tokens exactly and reads the speculative statistics from the
chunk that carries `finish_reason`. The API key, if the router needs one, is `api_key` or env
SPECDEC_API_KEY; an https:// URL is checked against the security section's CA (`security`).
"""
from __future__ import annotations

import http.client
import json
import os
from urllib.parse import urlsplit

from specdec.core.types import GenerationStats, SamplingParams
from specdec.errors import InvalidArgument, ServerError

STATS_FIELDS = ("num_new_tokens", "num_target_forwards", "num_draft_tokens", "num_accepted_tokens", "elapsed_s",
                "draft_s", "verify_s", "prefill_s")


def split_url(url: str) -> tuple[str, int]:
    """http(s)://HOST:PORT (a path such as /v1 may follow) or HOST:PORT -> (host, port)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme not in ("http", "https") or not parts.hostname or not parts.port:
        raise InvalidArgument(f"--http must be http://HOST:PORT or https://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port


def _connection(url: str, timeout_s: float, security) -> http.client.HTTPConnection:
    """Plain HTTP, or HTTPS trusting the security section's CA (and expecting its tls_server_name)."""
    host, port = split_url(url)
    if not url.startswith("https://"):
        return http.client.HTTPConnection(host, port, timeout=timeout_s)
    import ssl

    context = ssl.create_default_context(cafile=getattr(security, "tls_ca_file", None))
    name = getattr(security, "tls_server_name", None)
    return _HTTPSNamed(host, port, name or host, timeout=timeout_s, context=context)


class _HTTPSNamed(http.client.HTTPSConnection):
    """HTTPS that checks the server's certificate against `server_name` rather than the host dialled."""

    def __init__(self, host: str, port: int, server_name: str, **kwargs):
        super().__init__(host, port, **kwargs)
        self.server_name, self.tls_context = server_name, kwargs["context"]

    def connect(self) -> None:
        http.client.HTTPConnection.connect(self)
        self.sock = self.tls_context.wrap_socket(self.sock, server_hostname=self.server_name)


def request_body(prompt: str, params: SamplingParams) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "stop": list(params.stop), "ignore_eos": params.ignore_eos, "stream": True, "return_token_ids": True}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def http_stream(url: str, timeout_s: float, api_key: str | None = None, security=None):
    """(connection, stream): stream(prompt, params) yields (tokens in the chunk, stats on the last)."""
    connection = _connection(url, timeout_s, security)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    api_key = api_key or os.environ.get("SPECDEC_API_KEY")
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"

    def stream(prompt: str, params: SamplingParams):
        try:
            yield from _events(connection, request_body(prompt, params), headers)
        except BaseException:
            connection.close()  # whatever was left unread: the next request opens a fresh connection
            raise

    return connection, stream


def _events(connection: http.client.HTTPConnection, body: dict, headers: dict):
    connection.request("POST", "/v1/chat/completions", json.dumps(body), headers)
    response = connection.getresponse()
    if response.status != 200:
        raise ServerError(f"HTTP {response.status}: {response.read().decode(errors='replace')[:300]}")
    while line := response.readline():
        if not line.startswith(b"data: "):
            continue
        if line.strip() == b"data: [DONE]":
            response.read()  # the end of the chunked body: the connection can be reused
            return
        chunk = json.loads(line[len(b"data: "):])
        if "error" in chunk:
            raise ServerError(f"error event: {chunk['error'].get('message')}")
        choice = chunk["choices"][0] if chunk["choices"] else {}
        stats = chunk.get("speculative")
        yield (len(choice.get("token_ids", ())),
               GenerationStats(*(stats[name] for name in STATS_FIELDS)) if stats else None)
    raise ServerError("the event stream ended without data: [DONE]")
