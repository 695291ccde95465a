"""The only protobuf <-> dataclass conversion for plain data (no torch: the router imports it).

Draft trees carry tensors and live in trees.py. Values go through unchanged (temperature is a
double on the wire) so a request served over gRPC samples exactly as in process.
"""
from __future__ import annotations

from specdec.core.types import GenerationStats, SamplingParams
from specdec.errors import InvalidArgument
from specdec.rpc.v1 import common_pb2, generation_pb2

_OPTIONAL = ("temperature", "top_p", "top_k", "seed", "max_new_tokens")


def params_to_pb(params: SamplingParams) -> common_pb2.SamplingParams:
    msg = common_pb2.SamplingParams(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k,
                                    max_new_tokens=params.max_new_tokens, stop=list(params.stop),
                                    ignore_eos=params.ignore_eos)
    if params.seed is not None:
        msg.seed = params.seed
    return msg


def params_from_pb(msg: common_pb2.SamplingParams) -> SamplingParams:
    """Unset optional fields take SamplingParams' defaults; bad values raise InvalidArgument."""
    kwargs = {name: getattr(msg, name) for name in _OPTIONAL if msg.HasField(name)}
    return SamplingParams(stop=tuple(msg.stop), ignore_eos=msg.ignore_eos, **kwargs)


def stats_to_pb(stats: GenerationStats) -> common_pb2.GenerationStats:
    return common_pb2.GenerationStats(
        num_new_tokens=stats.num_new_tokens, num_target_forwards=stats.num_target_forwards,
        num_draft_tokens=stats.num_draft_tokens, num_accepted_tokens=stats.num_accepted_tokens,
        elapsed_s=stats.elapsed_s, draft_s=stats.draft_s, verify_s=stats.verify_s, prefill_s=stats.prefill_s,
        num_drafts=stats.num_drafts, num_accepted_per_pos=stats.num_accepted_per_pos)


def stats_from_pb(msg: common_pb2.GenerationStats) -> GenerationStats:
    return GenerationStats(msg.num_new_tokens, msg.num_target_forwards, msg.num_draft_tokens,
                           msg.num_accepted_tokens, msg.elapsed_s, msg.draft_s, msg.verify_s, msg.prefill_s,
                           msg.num_drafts, tuple(msg.num_accepted_per_pos))


def prompt_to_pb(request: generation_pb2.GenerateRequest, prompt) -> None:
    """Fill the request's prompt oneof from a string, token ids or chat messages ([{role, content}])."""
    if isinstance(prompt, str):
        request.text = prompt
    elif isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
        for m in prompt:
            if set(m) - {"role", "content"} or not isinstance(m.get("content", ""), str):
                raise InvalidArgument(f"chat message {m!r} must be {{'role': str, 'content': str}}")
            request.messages.messages.add(role=str(m.get("role", "")), content=m.get("content", ""))
    elif isinstance(prompt, (list, tuple)) and all(isinstance(t, int) for t in prompt):
        if not prompt:
            raise InvalidArgument("prompt is empty")
        request.token_ids.ids.extend(prompt)
    else:
        raise InvalidArgument(f"prompt must be a string, token ids or chat messages, not {type(prompt).__name__}")


def prompt_from_pb(request: generation_pb2.GenerateRequest) -> str | list[int] | list[dict]:
    kind = request.WhichOneof("prompt")
    if kind is None:
        raise InvalidArgument("request has no prompt (set text, messages or token_ids)")
    if kind == "text":
        return request.text
    if kind == "messages":
        return [{"role": m.role, "content": m.content} for m in request.messages.messages]
    return list(request.token_ids.ids)
