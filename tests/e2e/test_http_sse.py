"""The HTTP API through a second, independent client (raw HTTP with httpx): server-sent event framing
checked byte for byte, errors after the stream has started, and plain JSON endpoints."""
from __future__ import annotations

import json
import time

import httpx
import pytest

from e2e.harness import wait_released
from specdec.core.types import SamplingParams

pytestmark = pytest.mark.e2e
CHAT = [{"role": "user", "content": "Say hi"}]


@pytest.fixture(scope="module")
def http(http_stack):
    with httpx.Client(base_url=f"http://{http_stack.http_address}", timeout=120) as c:
        yield c


def read_events(http: httpx.Client, path: str, body: dict) -> tuple[httpx.Response, bytes]:
    with http.stream("POST", path, json=body) as response:
        return response, b"".join(response.iter_raw())


def parse_sse(raw: bytes) -> list[dict]:
    """Each event must be exactly `data: <one-line compact JSON>` + blank line, and the last `data: [DONE]`."""
    events = raw.split(b"\n\n")
    assert events[-2:] == [b"data: [DONE]", b""], raw[-200:]
    objects = []
    for event in events[:-2]:
        assert event.startswith(b"data: ") and b"\n" not in event and b"\r" not in event, event
        obj = json.loads(event[len(b"data: "):])
        assert event == b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode()
        objects.append(obj)
    return objects


def test_chat_stream_framing_byte_for_byte(http, reference):
    expected = reference("draft", CHAT, SamplingParams(max_new_tokens=20, ignore_eos=True), chat=True)
    response, raw = read_events(http, "/v1/chat/completions", {
        "messages": CHAT, "max_tokens": 20, "stream": True, "stream_options": {"include_usage": True},
        "ignore_eos": True, "return_token_ids": True})
    assert response.status_code == 200
    assert response.headers["content-type"] == "text/event-stream; charset=utf-8"
    assert response.headers["cache-control"] == "no-cache"
    first, *body, finish, usage = parse_sse(raw)
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                 "finish_reason": None}]
    assert all(set(c) == {"id", "object", "created", "model", "choices", "usage"} for c in [first, *body])
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in body) == expected.text
    assert [t for c in body for t in c["choices"][0]["token_ids"]] == expected.token_ids
    assert finish["choices"][0]["delta"] == {} and finish["choices"][0]["finish_reason"] == "length"
    assert finish["prompt_token_ids"] == expected.prompt_token_ids
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 20


def test_completion_stream_without_usage(http, reference):
    expected = reference("draft", [4, 5, 6], SamplingParams(max_new_tokens=12, ignore_eos=True))
    response, raw = read_events(http, "/v1/completions", {"prompt": [4, 5, 6], "max_tokens": 12, "stream": True,
                                                          "ignore_eos": True})
    *body, finish = parse_sse(raw)
    assert "".join(c["choices"][0]["text"] for c in body) == expected.text
    assert all("usage" not in c and c["object"] == "text_completion" for c in [*body, finish])
    assert finish["choices"][0]["finish_reason"] == "length" and finish["speculative"]["num_new_tokens"] == 12


def test_error_after_the_stream_started_is_an_event(http, http_stack):
    """The deadline passes mid-stream: the status was already 200, so the error comes as an event, then [DONE].
    The deadline is a third of what the whole generation takes on this machine, so it passes mid-stream on a
    fast machine and a loaded one alike."""
    body = {"prompt": [1, 2, 3], "max_tokens": 900, "stream": True, "ignore_eos": True}
    start = time.monotonic()
    whole, _ = read_events(http, "/v1/completions", body)
    assert whole.status_code == 200
    deadline_s = (time.monotonic() - start) / 3
    with http.stream("POST", "/v1/completions", headers={"X-Timeout-S": f"{deadline_s:.3f}"}, json=body) as response:
        assert response.status_code == 200
        raw = b"".join(response.iter_raw())
    *chunks, error = parse_sse(raw)
    assert chunks and all("choices" in c for c in chunks)
    assert error == {"error": {"message": error["error"]["message"], "type": "timeout_error", "param": None,
                               "code": "deadline_exceeded"}}
    wait_released(http_stack.address)


def test_json_endpoints_and_refusals(http, http_stack):
    assert http.get("/health").json() == {"status": "ok"}
    models = http.get("/v1/models")
    assert models.headers["content-type"] == "application/json" and models.json()["object"] == "list"
    bad = http.post("/v1/completions", content=b"{not json", headers={"content-type": "application/json"})
    assert bad.status_code == 400 and bad.json() == {"error": {
        "message": "the request body is not valid JSON", "type": "invalid_request_error", "param": None,
        "code": None}}
    too_many = http.post("/v1/chat/completions", json={"messages": CHAT, "n": 3})
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "n"
    assert http.post("/v1/completions", json={"prompt": "x"}, headers={"X-Timeout-S": "soon"}).status_code == 400
    assert http.get("/v1/completions").status_code == 405
