"""The load test's HTTP transport: streamed chat completions against the router's OpenAI-compatible API.

Standard library only (http.client, one keep-alive connection per simulated user), so the load test
needs nothing the package does not already install. Each request asks for the token ids of every
chunk (`return_token_ids`) to count tokens exactly and reads the speculative statistics from the
chunk that carries `finish_reason`. The API key, if the router needs one, is env SPECDEC_API_KEY.
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
    """http://HOST:PORT (a path such as /v1 may follow) or HOST:PORT -> (host, port)."""
    parts = urlsplit(url if "://" in url else f"http://{url}")
    if parts.scheme != "http" or not parts.hostname or not parts.port:
        raise InvalidArgument(f"--http must be http://HOST:PORT, got {url!r}")
    return parts.hostname, parts.port


def request_body(prompt: str, params: SamplingParams) -> dict:
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": params.max_new_tokens,
            "temperature": params.temperature, "top_p": params.top_p, "top_k": params.top_k,
            "stop": list(params.stop), "ignore_eos": params.ignore_eos, "stream": True, "return_token_ids": True}
    if params.seed is not None:
        body["seed"] = params.seed
    return body


def http_stream(url: str, timeout_s: float):
    """(connection, stream): stream(prompt, params) yields (tokens in the chunk, stats on the last)."""
    host, port = split_url(url)
    connection = http.client.HTTPConnection(host, port, timeout=timeout_s)
    headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
    if os.environ.get("SPECDEC_API_KEY"):
        headers["Authorization"] = f"Bearer {os.environ['SPECDEC_API_KEY']}"

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
