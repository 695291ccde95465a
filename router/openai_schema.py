"""OpenAI's request and response bodies <-> the router's GenerateRequest / GenerateResponse (pure data).

Requests: the JSON types of every field are checked here (a wrong type is a 400 naming the field);
the values are checked where the gRPC door checks them (SamplingParams, the prompt encoder), so both
doors refuse the same things with the same words. A field that would change the output but cannot be
honoured (n > 1, logprobs, penalties, tools, ...) is refused with a 400 naming it rather than ignored;
fields unknown here are ignored, as clients send many optional ones. Extensions: `top_k`, `ignore_eos`,
`return_token_ids` (token ids in every choice and the prompt's ids), and in responses `speculative`
(the generation's statistics: tau, acceptance rate, drafted and accepted tokens, ...).
"""
from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field

from specdec.rpc.convert import stats_from_pb
from specdec.rpc.v1 import generation_pb2

FINISH_REASONS = {"eos": "stop", "stop": "stop", "length": "length"}
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's documented default for /v1/completions
NOT_SUPPORTED = {  # field -> the values this server can honour (it generates one plain choice)
    "n": (None, 1), "best_of": (None, 1), "echo": (None, False), "logprobs": (None, False, 0),
    "top_logprobs": (None, 0), "suffix": (None, ""), "presence_penalty": (None, 0, 0.0),
    "frequency_penalty": (None, 0, 0.0), "logit_bias": (None, {}), "tools": (None, []), "functions": (None, []),
    "tool_choice": (None, "none"), "response_format": (None, {"type": "text"}),
}


class ApiError(Exception):
    """An error as OpenAI returns it: HTTP status plus {"error": {message, type, param, code}}."""

    def __init__(self, status: int, message: str, type_: str = "invalid_request_error", param: str | None = None,
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.param, self.code = status, message, type_, param, code

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def bad_request(message: str, param: str | None) -> ApiError:
    return ApiError(400, message, param=param, code="invalid_value" if param else None)


@dataclass(frozen=True)
class ParsedRequest:
    request: generation_pb2.GenerateRequest
    chat: bool  # /v1/chat/completions (else /v1/completions)
    model: str
    stream: bool = False
    include_usage: bool = False
    return_token_ids: bool = False


def _typed(body: dict, name: str, types: tuple, what: str, default=None):
    value = body.get(name, default)
    if value is None:
        return default
    if isinstance(value, bool) and bool not in types or not isinstance(value, types):
        raise bad_request(f"'{name}' must be {what}, got {json.dumps(value)[:80]}", name)
    return value


def _set(params, name: str, value, param: str) -> None:
    try:
        setattr(params, name, value)
    except (ValueError, TypeError):  # beyond int64
        raise bad_request(f"'{param}' = {value} is out of range", param) from None


def _check_supported(body: dict) -> None:
    for name, fine in NOT_SUPPORTED.items():
        if name in body and body[name] not in fine:
            raise bad_request(f"'{name}' = {json.dumps(body[name])[:80]} is not supported by this server "
                              f"(it generates one choice of plain text per request)", name)


def parse_request(body, chat: bool, model_id: str) -> ParsedRequest:
    """A completions or chat request body -> the GenerateRequest both doors hand to the dispatcher."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object", None)
    _check_supported(body)
    model = _typed(body, "model", (str,), "a string", model_id)
    if model != model_id:
        raise ApiError(404, f"the model {model!r} does not exist; this server serves {model_id!r}",
                       param="model", code="model_not_found")
    request = generation_pb2.GenerateRequest(user=_typed(body, "user", (str,), "a string", ""))
    if chat:
        _add_messages(request, body.get("messages"))
    else:
        _add_prompt(request, body.get("prompt"))
    max_tokens = _typed(body, "max_completion_tokens", (int,), "an integer",
                        _typed(body, "max_tokens", (int,), "an integer"))
    if max_tokens is None and not chat:
        max_tokens = COMPLETIONS_DEFAULT_MAX_TOKENS
    params = request.params
    if max_tokens is not None:  # unset in chat: the rest of the context (the dispatcher fills it)
        _set(params, "max_new_tokens", max_tokens, "max_completion_tokens" if chat else "max_tokens")
    for name, types, what in (("temperature", (int, float), "a number"), ("top_p", (int, float), "a number"),
                              ("top_k", (int,), "an integer"), ("seed", (int,), "an integer")):
        value = _typed(body, name, types, what)
        if value is not None:
            _set(params, name, value, name)
    params.ignore_eos = _typed(body, "ignore_eos", (bool,), "true or false", False)
    stop = body.get("stop")
    stops = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise bad_request("'stop' must be a string or a list of strings", "stop")
    params.stop.extend(stops)
    stream = _typed(body, "stream", (bool,), "true or false", False)
    options = _typed(body, "stream_options", (dict,), "an object", {})
    if options and not stream:
        raise bad_request("'stream_options' is only allowed when 'stream' is true", "stream_options")
    return ParsedRequest(request, chat, model, stream,
                         bool(_typed(options, "include_usage", (bool,), "true or false", False)),
                         _typed(body, "return_token_ids", (bool,), "true or false", False))


def _add_prompt(request: generation_pb2.GenerateRequest, prompt) -> None:
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    if isinstance(prompt, str):
        request.text = prompt
    elif prompt == []:
        raise bad_request("prompt is empty", "prompt")
    elif isinstance(prompt, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        request.token_ids.ids.extend(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(p, (str, list)) for p in prompt):
        raise bad_request(f"a batch of {len(prompt)} prompts is not supported: send one prompt per request", "prompt")
    else:
        raise bad_request("'prompt' must be a string or a list of token ids", "prompt")


def _add_messages(request: generation_pb2.GenerateRequest, messages) -> None:
    if not isinstance(messages, list) or not messages:
        raise bad_request("'messages' must be a non-empty list of {role, content} objects", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict) or not isinstance(message.get("role"), str):
            raise bad_request(f"{where} must be an object with a string 'role'", where)
        content = message.get("content")
        if isinstance(content, list):  # content parts: only text can be rendered by a text model
            if not all(isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
                       for p in content):
                raise bad_request(f"{where}.content: only parts of type 'text' are supported", f"{where}.content")
            content = "".join(p["text"] for p in content)
        elif content is not None and not isinstance(content, str):
            raise bad_request(f"{where}.content must be a string or a list of text parts", f"{where}.content")
        request.messages.messages.add(role=message["role"], content=content or "")


@dataclass
class ResponseBuilder:
    """The response objects of one request: chunks while streaming, or one object at the end."""

    parsed: ParsedRequest
    id: str = field(default="")
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        self.id = ("chatcmpl-" if self.parsed.chat else "cmpl-") + uuid.uuid4().hex

    def _envelope(self, chunk: bool) -> dict:
        kind = ("chat.completion" if self.parsed.chat else "text_completion") + (".chunk" if chunk and self.parsed.chat
                                                                               else "")
        return {"id": self.id, "object": kind, "created": self.created, "model": self.parsed.model}

    def _choice(self, text: str, token_ids, finish_reason: str | None, chunk: bool) -> dict:
        if not self.parsed.chat:
            choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}
        elif chunk:
            choice = {"index": 0, "delta": {"content": text} if text else {}, "logprobs": None,
                      "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": None,
                      "finish_reason": finish_reason}
        if self.parsed.return_token_ids:
            choice["token_ids"] = list(token_ids)
        return choice

    def _final_fields(self, final: generation_pb2.FinalInfo) -> dict:
        fields = {"speculative": stats_from_pb(final.stats).to_dict()}
        if self.parsed.return_token_ids:
            fields["prompt_token_ids"] = list(final.prompt_token_ids)
        return fields

    def first_chunks(self) -> list[dict]:
        """Chat streams open with the assistant's role, as OpenAI's do."""
        if not self.parsed.chat:
            return []
        return [self._chunk([{"index": 0, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                               "finish_reason": None}])]

    def _chunk(self, choices: list[dict], **fields) -> dict:
        """A stream chunk; with include_usage every chunk has `usage` (null but on the last, as OpenAI's)."""
        usage_ = {"usage": None} if self.parsed.include_usage else {}
        return {**self._envelope(chunk=True), **fields, "choices": choices, **usage_}

    def chunks(self, response: generation_pb2.GenerateResponse) -> list[dict]:
        """The stream chunks of one GenerateResponse: its text (if any), then on the last the finish and usage."""
        out = []
        if response.text or (self.parsed.return_token_ids and response.token_ids):
            out.append(self._chunk([self._choice(response.text, response.token_ids, None, chunk=True)]))
        if response.HasField("final"):
            final = response.final
            out.append(self._chunk([self._choice("", [], FINISH_REASONS[final.finish_reason], chunk=True)],
                                   **self._final_fields(final)))
            if self.parsed.include_usage:
                out.append({**self._envelope(chunk=True), "choices": [], "usage": usage(final)})
        return out

    def complete(self, responses: list[generation_pb2.GenerateResponse]) -> dict:
        final = responses[-1].final
        token_ids = [t for r in responses for t in r.token_ids]
        return {**self._envelope(chunk=False),
                "choices": [self._choice(final.text, token_ids, FINISH_REASONS[final.finish_reason], chunk=False)],
                "usage": usage(final), **self._final_fields(final)}


def usage(final: generation_pb2.FinalInfo) -> dict:
    prompt, completion = len(final.prompt_token_ids), final.stats.num_new_tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


def sse(obj: dict) -> bytes:
    """One server-sent event: `data: <JSON on one line>` and a blank line."""
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"


SSE_DONE = b"data: [DONE]\n\n"
