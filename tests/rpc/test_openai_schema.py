"""OpenAI request bodies -> GenerateRequest, responses -> OpenAI objects, and API keys (no server)."""
from __future__ import annotations

import json

import grpc
import pytest

from router.api_keys import ApiKeys
from router.http_api import api_error
from router.openai_schema import ApiError, ResponseBuilder, parse_request, sse
from specdec.core.types import GenerationStats
from specdec.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted, Unauthenticated, Unavailable
from specdec.rpc.convert import params_from_pb, stats_to_pb
from specdec.rpc.v1 import generation_pb2

MODEL = "smol"


def test_completion_fields_map_onto_the_grpc_request():
    parsed = parse_request({"model": MODEL, "prompt": "Hi", "max_tokens": 7, "temperature": 0.5, "top_p": 0.9,
                            "top_k": 20, "seed": 3, "stop": "\n", "user": "ada", "stream": True,
                            "stream_options": {"include_usage": True}}, chat=False, model_id=MODEL)
    request = parsed.request
    assert request.text == "Hi" and request.user == "ada" and not parsed.chat
    params = params_from_pb(request.params)
    assert (params.max_new_tokens, params.temperature, params.top_p, params.top_k, params.seed, params.stop) == (
        7, 0.5, 0.9, 20, 3, ("\n",))
    assert parsed.stream and parsed.include_usage and not parsed.return_token_ids


def test_defaults_prompt_forms_and_chat_messages():
    completion = parse_request({"prompt": [[5, 6, 7]]}, chat=False, model_id=MODEL)  # no model: the served one
    assert list(completion.request.token_ids.ids) == [5, 6, 7] and completion.model == MODEL
    assert completion.request.params.max_new_tokens == 16  # OpenAI's default for completions
    chat = parse_request({"model": MODEL, "max_completion_tokens": 9, "max_tokens": 99, "messages": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "there"}]}]},
        chat=True, model_id=MODEL)
    assert [(m.role, m.content) for m in chat.request.messages.messages] == [("system", "Be brief."),
                                                                             ("user", "Hello there")]
    assert chat.request.params.max_new_tokens == 9  # max_completion_tokens wins
    unbounded = parse_request({"messages": [{"role": "user", "content": "x"}]}, chat=True, model_id=MODEL)
    assert not unbounded.request.params.HasField("max_new_tokens")  # the dispatcher fills the context


@pytest.mark.parametrize("body,status,param,words", [
    ({"prompt": "x", "n": 2}, 400, "n", "'n' = 2 is not supported"),
    ({"prompt": "x", "logprobs": 3}, 400, "logprobs", "not supported"),
    ({"prompt": "x", "presence_penalty": 0.5}, 400, "presence_penalty", "not supported"),
    ({"prompt": "x", "temperature": "hot"}, 400, "temperature", "must be a number"),
    ({"prompt": "x", "max_tokens": True}, 400, "max_tokens", "must be an integer"),
    ({"prompt": "x", "seed": 2 ** 70}, 400, "seed", "out of range"),
    ({"prompt": "x", "stop": ["a", 1]}, 400, "stop", "list of strings"),
    ({"prompt": ["a", "b"]}, 400, "prompt", "a batch of 2 prompts"),
    ({"prompt": {"text": "x"}}, 400, "prompt", "string or a list of token ids"),
    ({"prompt": []}, 400, "prompt", "prompt is empty"),
    ({"prompt": "x", "stream_options": {"include_usage": True}}, 400, "stream_options", "only allowed"),
    ({"prompt": "x", "model": "gpt-4o"}, 404, "model", "does not exist"),
])
def test_bad_completion_bodies(body, status, param, words):
    with pytest.raises(ApiError) as err:
        parse_request(body, chat=False, model_id=MODEL)
    assert (err.value.status, err.value.param) == (status, param) and words in err.value.message
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


@pytest.mark.parametrize("messages,param", [
    ([], "messages"), ("hi", "messages"), ([{"content": "x"}], "messages[0]"),
    ([{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}], "messages[0].content"),
])
def test_bad_chat_messages(messages, param):
    with pytest.raises(ApiError) as err:
        parse_request({"messages": messages}, chat=True, model_id=MODEL)
    assert err.value.status == 400 and err.value.param == param


@pytest.mark.parametrize("exc,status,code", [
    (InvalidArgument("top_p must be in (0, 1], got 2"), 400, "invalid_argument"),
    (Unauthenticated("invalid API key"), 401, "unauthenticated"),
    (ResourceExhausted("server busy"), 429, "resource_exhausted"),
    (Unavailable("no healthy target worker"), 503, "unavailable"),
    (DeadlineExceeded("deadline passed while queued"), 504, "deadline_exceeded"),
    (RuntimeError("bug"), 500, "internal"),
])
def test_router_errors_get_the_status_a_client_expects(exc, status, code):
    error = api_error(exc, chat=False)
    assert (error.status, error.code) == (status, code)
    assert error.param == ("top_p" if status == 400 else None)


def test_downstream_grpc_errors_are_mapped_too():
    class Downstream(grpc.RpcError):
        def code(self):
            return grpc.StatusCode.DEADLINE_EXCEEDED

        def details(self):
            return "Deadline Exceeded"

    error = api_error(Downstream(), chat=True)
    assert error.status == 504 and "X-Timeout-S" in error.message


def _responses() -> list[generation_pb2.GenerateResponse]:
    stats = GenerationStats(num_new_tokens=3, num_target_forwards=2, num_draft_tokens=4, num_accepted_tokens=1,
                            elapsed_s=0.5)
    last = generation_pb2.GenerateResponse(text="lo", token_ids=[12])
    last.final.CopyFrom(generation_pb2.FinalInfo(finish_reason="eos", stats=stats_to_pb(stats),
                                                 prompt_token_ids=[1, 2, 3, 4], text="Hello"))
    return [generation_pb2.GenerateResponse(text="Hel", token_ids=[10, 11]), last]


def test_chat_stream_chunks_then_usage():
    parsed = parse_request({"messages": [{"role": "user", "content": "x"}], "stream": True,
                            "stream_options": {"include_usage": True}, "return_token_ids": True},
                           chat=True, model_id=MODEL)
    builder = ResponseBuilder(parsed)
    chunks = builder.first_chunks() + [c for r in _responses() for c in builder.chunks(r)]
    assert [c["object"] for c in chunks] == ["chat.completion.chunk"] * 5
    assert len({c["id"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    assert [c["choices"][0]["delta"].get("content") for c in chunks[1:3]] == ["Hel", "lo"]
    assert [c["choices"][0]["token_ids"] for c in chunks[1:3]] == [[10, 11], [12]]
    finish = chunks[3]
    assert finish["choices"][0]["finish_reason"] == "stop" and finish["prompt_token_ids"] == [1, 2, 3, 4]
    assert finish["speculative"]["tau"] == 1.5 and finish["speculative"]["acceptance_rate"] == 0.25
    assert all(c["usage"] is None for c in chunks[:4])
    assert chunks[4]["choices"] == [] and chunks[4]["usage"] == {"prompt_tokens": 4, "completion_tokens": 3,
                                                                 "total_tokens": 7}


def test_a_step_without_text_is_sent_only_for_its_token_ids():
    """A commit may end inside a character or a possible stop string: no text yet, but tokens."""
    held_back = generation_pb2.GenerateResponse(text="", token_ids=[99])
    for return_token_ids, expected in ((False, []), (True, [{"index": 0, "delta": {}, "logprobs": None,
                                                              "finish_reason": None, "token_ids": [99]}])):
        parsed = parse_request({"messages": [{"role": "user", "content": "x"}], "stream": True,
                                "return_token_ids": return_token_ids}, chat=True, model_id=MODEL)
        assert [c["choices"] for c in ResponseBuilder(parsed).chunks(held_back)] == ([expected] if expected else [])


def test_completion_object_and_sse_framing():
    parsed = parse_request({"prompt": "x"}, chat=False, model_id=MODEL)
    body = ResponseBuilder(parsed).complete(_responses())
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert body["choices"] == [{"index": 0, "text": "Hello", "logprobs": None, "finish_reason": "stop"}]
    assert body["usage"]["total_tokens"] == 7 and body["speculative"]["num_draft_tokens"] == 4
    event = sse({"text": "a\nb ü"})
    assert event == b'data: {"text":"a\\nb \xc3\xbc"}\n\n' and json.loads(event[6:]) == {"text": "a\nb ü"}


def test_api_keys_from_file_and_environment(tmp_path):
    assert not ApiKeys.load(None, environ={}).enabled
    ApiKeys.load(None, environ={}).check(None)  # no key configured: nothing is checked
    path = tmp_path / "keys"
    path.write_text("# team keys\nk-file\n\n")
    keys = ApiKeys.load(str(path), environ={"SPECDEC_API_KEYS": "k-env1, k-env2"})
    assert keys.keys == ("k-env1", "k-env2", "k-file")
    for good in ("Bearer k-file", "bearer k-env2"):
        keys.check(good)
    for bad, words in ((None, "needs an API key"), ("k-file", "needs an API key"), ("Bearer nope", "invalid")):
        with pytest.raises(Unauthenticated, match=words):
            keys.check(bad)
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(InvalidArgument, match="holds no key"):
        ApiKeys.load(str(tmp_path / "empty"), environ={})
    with pytest.raises(InvalidArgument, match="cannot read"):
        ApiKeys.load(str(tmp_path / "missing"), environ={})
