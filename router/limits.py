"""Bounds on what one request may carry, checked before anything expensive is done with it.

A prompt is refused by its size in bytes before it is tokenized: tokenizing costs time and memory in
proportion to the text (a 16 MB prompt once took the router 30 s and 3.4 GB), and a prompt too large
for the context is refused anyway afterwards. The byte bound is derived so that it never refuses a
prompt that could fit: a text of more than `max_context_len x longest_token_bytes` bytes needs more
tokens than the context holds (every token stands for at most `longest_token_bytes` bytes of text;
true of byte-level and other lossless tokenizers, so a deployment whose tokenizer drops text sets
`max_prompt_bytes` itself).

The gRPC door's message size limit (`max_receive_bytes`) is set well above the largest valid request
(`max_request_bytes`): at least 32 MiB, at least twice that. A request up to it is read and refused
by the router with INVALID_ARGUMENT naming `max_prompt_bytes` (what a client can act on: send less):
one larger than any valid request by its size on the wire, unparsed (router.oversize), the others
here, field by field. Only a message above the gRPC limit is refused by gRPC itself, before it is
read, with RESOURCE_EXHAUSTED ("Received message larger than max (N vs. M)").

The other limits bound the work a request causes per generated token (stop strings are searched
at every step) or close doors the template never meant to open (a chat role is written into the
prompt verbatim, so only the roles chat templates know are accepted). Every refusal is an
InvalidArgument whose message starts with the field and names the limit.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.core.types import check_temperature
from specdec.errors import InvalidArgument

CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
# The message bytes a request may carry besides its prompt and stop strings: the user name, sampling
# parameters and the protobuf framing of each chat message (role, tags, lengths).
OTHER_FIELDS_BYTES = 4096
MESSAGE_FRAMING_BYTES = 32
TOKEN_ID_BYTES = 10  # a varint-encoded token id, at most
REFUSED_IN_FULL_BYTES = 32 << 20  # requests up to this size get the router's own INVALID_ARGUMENT


@dataclass(frozen=True)
class RequestLimits:
    max_prompt_bytes: int  # text, or the chat messages' contents and roles together, UTF-8
    max_prompt_tokens: int  # a prompt given as token ids (the context length)
    max_stop_strings: int = 16
    max_stop_bytes: int = 256  # each stop string
    max_messages: int = 512

    @property
    def max_request_bytes(self) -> int:
        """The largest serialized GenerateRequest any valid request can be (the gRPC message limit)."""
        prompt = max(self.max_prompt_bytes + self.max_messages * MESSAGE_FRAMING_BYTES,
                     self.max_prompt_tokens * TOKEN_ID_BYTES)
        return prompt + self.max_stop_strings * (self.max_stop_bytes + 8) + OTHER_FIELDS_BYTES

    @property
    def max_receive_bytes(self) -> int:
        """The gRPC message limit: up to it an oversized request is refused by `check_request`, naming
        the limit it is over; beyond it gRPC refuses the message unread (see the module doc)."""
        return max(REFUSED_IN_FULL_BYTES, 2 * self.max_request_bytes)


def derive_limits(max_context_len: int, longest_token_bytes: int, max_prompt_bytes: int = 0,
                  max_stop_strings: int = 16, max_stop_bytes: int = 256, max_messages: int = 512) -> RequestLimits:
    """max_prompt_bytes 0 = the context's worth of the longest token (see the module doc)."""
    derived = max_context_len * max(longest_token_bytes, 1)
    return RequestLimits(max_prompt_bytes or derived, max_context_len, max_stop_strings, max_stop_bytes,
                         max_messages)


def check_request(request, limits: RequestLimits) -> None:
    """Refuse a GenerateRequest that is over a limit, looking only at sizes (no copy of the prompt
    text beyond one UTF-8 measure of a text already known to be small enough)."""
    kind = request.WhichOneof("prompt")
    if kind == "text":
        _check_bytes("prompt", request.text, limits.max_prompt_bytes)
    elif kind == "messages":
        messages = request.messages.messages
        if len(messages) > limits.max_messages:
            raise InvalidArgument(f"chat messages: {len(messages)} messages; the limit is {limits.max_messages} "
                                  f"(max_messages)")
        total = 0
        for i, message in enumerate(messages):
            if message.role not in CHAT_ROLES:
                raise InvalidArgument(f"chat messages[{i}].role {message.role[:40]!r} is not one of "
                                      f"{', '.join(CHAT_ROLES)}")
            total += len(message.content) + len(message.role)
            if total > limits.max_prompt_bytes:  # characters <= bytes: over already
                break
        else:
            total = sum(len(m.content.encode("utf-8")) + len(m.role) for m in messages)
        if total > limits.max_prompt_bytes:
            raise InvalidArgument(f"prompt: the chat messages are more than {limits.max_prompt_bytes} bytes "
                                  f"(max_prompt_bytes), more than the model's context can hold")
    elif kind == "token_ids" and len(request.token_ids.ids) > limits.max_prompt_tokens:
        raise InvalidArgument(f"prompt is {len(request.token_ids.ids)} token ids; the model's context holds "
                              f"{limits.max_prompt_tokens} (max_prompt_tokens)")
    stops = request.params.stop
    if len(stops) > limits.max_stop_strings:
        raise InvalidArgument(f"stop: {len(stops)} stop strings; the limit is {limits.max_stop_strings} "
                              f"(max_stop_strings)")
    for stop in stops:
        _check_bytes("stop string", stop, limits.max_stop_bytes, "max_stop_bytes", "stop: ")
    if request.params.HasField("temperature"):
        check_temperature(request.params.temperature)


def _check_bytes(what: str, text: str, limit: int, name: str = "max_prompt_bytes", prefix: str = "") -> None:
    if len(text) > limit:  # characters <= bytes: over without measuring
        size = f"at least {len(text)}"
    else:
        num_bytes = len(text.encode("utf-8"))
        if num_bytes <= limit:
            return
        size = str(num_bytes)
    raise InvalidArgument(f"{prefix}{what} is {size} bytes; the limit is {limit} ({name})")
