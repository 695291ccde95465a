"""The router's OpenAI-compatible HTTP API against a live stack on 127.0.0.1, through the official
`openai` client: greedy output equals the in-process engine token for token, usage and speculative
statistics, every error status, deadlines, and a disconnect that frees the sequence at every worker.
(test_http_sse.py checks the same API with a raw HTTP client, byte for byte.)"""
from __future__ import annotations

import threading
import time

import httpx
import openai
import pytest

from e2e.harness import held_sequences, running, wait_released
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.errors import Unauthenticated
from specdec.serving_config import RouterConfig, TargetConfig

pytestmark = pytest.mark.e2e
EXTRA = {"ignore_eos": True, "return_token_ids": True}  # extensions: fixed lengths, token ids in every choice
CHAT = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Say hi"}]


def make_client(http_address: str, **options) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"http://{http_address}/v1", api_key=options.pop("api_key", "unused"),
                         max_retries=0, timeout=options.pop("timeout", 120), **options)


@pytest.fixture(scope="module")
def client(http_stack):
    with make_client(http_stack.http_address) as c:
        yield c


@pytest.fixture(scope="module")
def model_id(client, tiny_models) -> str:
    (model,) = client.models.list().data
    assert model.id == tiny_models["target"].name and model.model_extra["max_model_len"] == 1024
    return model.id


@pytest.mark.parametrize("prompt", ["The quick brown fox", [5, 17, 99, 3, 5, 17, 99, 3, 5, 17]])
def test_completion_equals_in_process(client, model_id, reference, prompt):
    expected = reference("draft", prompt, SamplingParams(max_new_tokens=32, ignore_eos=True))
    out = client.completions.create(model=model_id, prompt=prompt, max_tokens=32, extra_body=EXTRA)
    (choice,) = out.choices
    assert choice.model_extra["token_ids"] == expected.token_ids and choice.text == expected.text
    assert choice.finish_reason == "length" and out.object == "text_completion"
    assert out.model_extra["prompt_token_ids"] == expected.prompt_token_ids
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (
        len(expected.prompt_token_ids), 32, len(expected.prompt_token_ids) + 32)
    spec = out.model_extra["speculative"]
    assert spec["num_new_tokens"] == 32 and 0 <= spec["num_accepted_tokens"] <= spec["num_draft_tokens"]
    assert spec["tau"] == pytest.approx(32 / spec["num_target_forwards"])


def test_completion_stream_equals_in_process(client, model_id, reference):
    expected = reference("draft", "Once upon a time", SamplingParams(max_new_tokens=24, ignore_eos=True))
    chunks = list(client.completions.create(model=model_id, prompt="Once upon a time", max_tokens=24, stream=True,
                                            stream_options={"include_usage": True}, extra_body=EXTRA))
    *body, finish, last = chunks
    assert "".join(c.choices[0].text for c in body) == expected.text
    assert [t for c in body for t in c.choices[0].model_extra["token_ids"]] == expected.token_ids
    assert finish.choices[0].finish_reason == "length" and finish.model_extra["speculative"]["num_new_tokens"] == 24
    assert last.choices == [] and last.usage.completion_tokens == 24
    assert all(c.usage is None for c in chunks[:-1]) and len({c.id for c in chunks}) == 1


def test_chat_equals_in_process_streaming_or_not(client, model_id, reference):
    expected = reference("draft", CHAT, SamplingParams(max_new_tokens=24, ignore_eos=True), chat=True)
    out = client.chat.completions.create(model=model_id, messages=CHAT, max_completion_tokens=24, extra_body=EXTRA)
    (choice,) = out.choices
    assert choice.message.role == "assistant" and choice.message.content == expected.text
    assert choice.model_extra["token_ids"] == expected.token_ids and choice.finish_reason == "length"
    assert out.usage.prompt_tokens == len(expected.prompt_token_ids) == len(out.model_extra["prompt_token_ids"])
    assert out.usage.completion_tokens == 24 and out.object == "chat.completion"

    chunks = list(client.chat.completions.create(model=model_id, messages=CHAT, max_tokens=24, stream=True,
                                                 stream_options={"include_usage": True}, extra_body=EXTRA))
    first, *body, finish, last = chunks
    assert first.choices[0].delta.role == "assistant" and first.object == "chat.completion.chunk"
    assert "".join(c.choices[0].delta.content or "" for c in body) == expected.text
    assert [t for c in body for t in c.choices[0].model_extra["token_ids"]] == expected.token_ids
    assert finish.choices[0].finish_reason == "length" and finish.model_extra["speculative"]["tau"] >= 1.0
    assert last.usage.prompt_tokens == out.usage.prompt_tokens and last.usage.total_tokens == out.usage.total_tokens


def test_chat_without_max_tokens_fills_the_context(client, model_id):
    """As OpenAI's chat API: no max_tokens = up to the model's context (1024 tokens for the tiny model)."""
    out = client.chat.completions.create(model=model_id, messages=[{"role": "user", "content": "Go on"}],
                                         extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "length" and out.usage.total_tokens == 1024


def test_sampling_fields_reach_the_target(client, model_id, reference):
    """top_k (an extra field) = 1 turns even a hot temperature into greedy; stop ends the text before it."""
    greedy = reference("draft", "Tell me a story", SamplingParams(max_new_tokens=16, ignore_eos=True))
    out = client.completions.create(model=model_id, prompt="Tell me a story", max_tokens=16, temperature=5.0,
                                    seed=7, extra_body={**EXTRA, "top_k": 1})
    assert out.choices[0].model_extra["token_ids"] == greedy.token_ids
    stop = greedy.text[len(greedy.text) // 2:][:4]
    out = client.completions.create(model=model_id, prompt="Tell me a story", max_tokens=16, stop=[stop],
                                    extra_body={"ignore_eos": True})
    assert out.choices[0].finish_reason == "stop" and out.choices[0].text == greedy.text[:greedy.text.index(stop)]


def test_user_is_the_fairness_key_and_disconnect_releases(http_stack, client, model_id):
    wait_released(http_stack.address)
    stream = client.completions.create(model=model_id, prompt=[3, 1, 4, 1, 5], max_tokens=900, stream=True,
                                       user="ada-http", extra_body={"ignore_eos": True})
    next(iter(stream))
    with Client(http_stack.address) as grpc_client:
        users = {u.user: u.num_active for u in grpc_client.server_info().users}
    assert users == {"ada-http": 1}
    targets, drafts = held_sequences(http_stack.address)
    assert len(targets) == 1 and drafts == targets  # held at both workers while it runs
    stream.close()  # the client goes away mid-stream
    wait_released(http_stack.address)


def test_non_streaming_disconnect_releases(http_stack, model_id):
    wait_released(http_stack.address)
    with make_client(http_stack.http_address, timeout=1.0) as impatient, pytest.raises(openai.APITimeoutError):
        impatient.completions.create(model=model_id, prompt=[2, 7, 1, 8], max_tokens=900,
                                     extra_body={"ignore_eos": True})
    wait_released(http_stack.address)


def test_deadline_is_504_and_releases(http_stack, client, model_id):
    with pytest.raises(openai.InternalServerError) as err:
        client.completions.create(model=model_id, prompt=[2, 7, 1, 8], max_tokens=900,
                                  extra_body={"ignore_eos": True}, extra_headers={"X-Timeout-S": "0.5"})
    assert err.value.status_code == 504 and err.value.body["code"] == "deadline_exceeded"
    assert "deadline" in err.value.body["message"]
    wait_released(http_stack.address)


@pytest.mark.parametrize("kwargs,param,words", [
    (dict(prompt="hi", n=2), "n", "not supported"),
    (dict(prompt="hi", temperature=-1), "temperature", "temperature must be 0 (greedy) or in [0.01, 100]"),
    (dict(prompt="hi", top_p=1.5), "top_p", "top_p must be in (0, 1]"),
    (dict(prompt=""), "prompt", "prompt is empty"),
    (dict(prompt=[1, 2, 10 ** 9]), "prompt", "outside the vocabulary"),
    (dict(prompt=[1, 2, 3], max_tokens=5000), "prompt", "exceeds the model's context"),
])
def test_bad_parameters_are_400(client, model_id, kwargs, param, words):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_id, **kwargs)
    assert err.value.status_code == 400 and err.value.param == param and words in err.value.message
    assert err.value.type == "invalid_request_error"


def test_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as err:
        client.chat.completions.create(model="gpt-4o", messages=CHAT)
    assert err.value.code == "model_not_found" and err.value.param == "model"


def wait_for(predicate, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.1)


def test_keys_queue_and_full_queue(http_stack, model_id, tmp_path):
    """A second router on the same workers, with an API key, one slot and a queue of one: 401; a queued
    client that goes away leaves the queue; a request beyond the queue gets 429; the queued one then runs."""
    (tmp_path / "keys").write_text("sk-test\n")
    config = RouterConfig(targets=(http_stack.targets[0].address,), drafts=(http_stack.drafts[0].address,),
                          max_active=1, max_queue=1, api_keys_file=str(tmp_path / "keys"))
    with running("router", config) as router:
        assert httpx.get(f"http://{router.http_address}/health", timeout=10).status_code == 200  # open for probes
        anonymous = httpx.post(f"http://{router.http_address}/v1/completions", json={"prompt": "x"}, timeout=10)
        assert anonymous.status_code == 401 and anonymous.json()["error"]["type"] == "authentication_error"
        with make_client(router.http_address, api_key="sk-wrong") as wrong, \
                pytest.raises(openai.AuthenticationError) as err:
            wrong.models.list()
        assert err.value.status_code == 401 and err.value.body["message"] == "invalid API key"
        with Client(router.address, api_key="") as anonymous, pytest.raises(Unauthenticated):
            anonymous.server_info()
        with make_client(router.http_address, api_key="sk-test") as keyed, \
                Client(router.address, api_key="sk-test") as keyed_grpc:
            stream = keyed.completions.create(model=model_id, prompt=[9, 9, 9], max_tokens=900, stream=True,
                                              extra_body={"ignore_eos": True})
            next(iter(stream))
            with make_client(router.http_address, api_key="sk-test", timeout=1.0) as impatient, \
                    pytest.raises(openai.APITimeoutError):
                impatient.completions.create(model=model_id, prompt=[8, 8], max_tokens=4)  # waits, then leaves
            wait_for(lambda: keyed_grpc.server_info().num_abandoned == 1)
            queued: list = []
            waiter = threading.Thread(target=lambda: queued.append(
                keyed.completions.create(model=model_id, prompt=[7, 7], max_tokens=4, extra_body={"ignore_eos": True})))
            waiter.start()
            wait_for(lambda: keyed_grpc.server_info().num_queued == 1)
            with pytest.raises(openai.RateLimitError) as err:
                keyed.chat.completions.create(model=model_id, messages=CHAT, max_tokens=4)
            assert err.value.status_code == 429 and "server busy" in err.value.message
            assert err.value.response.headers["retry-after"] == "1"
            stream.close()  # frees the slot: the queued request runs
            waiter.join(60)
            assert queued[0].usage.completion_tokens == 4
            info = keyed_grpc.server_info()
            assert (info.num_admitted, info.num_rejected, info.num_abandoned) == (2, 1, 1)


def test_no_healthy_target_is_503(tiny_models):
    target = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1)
    with running("target", target) as target_process:
        with running("router", RouterConfig(targets=(target_process.address,))) as router:
            target_process.kill()
            with make_client(router.http_address) as c:
                for _ in range(2):  # the call that finds it dead, then the router's own refusal
                    with pytest.raises(openai.InternalServerError) as err:
                        c.completions.create(model=tiny_models["target"].name, prompt=[1, 2, 3], max_tokens=4)
                    assert err.value.status_code == 503 and err.value.body["code"] == "unavailable"
            health = httpx.get(f"http://{router.http_address}/health", timeout=10)
            assert health.status_code == 503 and health.json()["error"]["message"] == "no healthy target worker"
