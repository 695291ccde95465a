"""One admitted generation's conversation with the targets: relay its commits to the client and, when
its target dies, continue it on another (failover).

The client must never notice the switch in its stream: no token lost, none repeated. So what counts
is what the client was sent (`Tally`): every commit relayed is recorded before it is yielded, and a
generation continues on the next target from exactly those tokens. That target is admitted with the
prompt and `resumed_ids` = the tokens streamed so far; it prefills both, counts them against
max_new_tokens, replays them through its text stream (their text was sent already; a character or a
stop string split across the switch comes out whole), and streams only what follows. Its draft
worker, if any, is attached afresh with the prompt plus those tokens as its context.

What continues exactly:
- greedy: the continuation is the one plain decoding gives for prompt + streamed tokens, so the
  client's stream equals an undisturbed run token for token;
- sampled with a seed: a sequence's draws at each step depend only on the seed and the number of
  committed tokens (specdec.core.sampling.step_seed), so the new target draws exactly what the dead
  one would have drawn next. Decoding without drafts (or with the same drafts) the stream equals an
  undisturbed run; with a draft worker the drafts themselves may differ (they depend on timing, as
  in any run), and then only the distribution is the same;
- sampled without a seed: the dead target's random state is gone; the continuation draws fresh
  entropy. Every token is still drawn from the target's distribution given the prompt and all tokens
  before it, so the stream is a sample from the same distribution as an undisturbed one.

When it fails over: the target's call ends with UNAVAILABLE (the process died, its connection broke,
or its decode loop stopped) while the client is still there and its deadline has not passed. The
dead target is benched (router.pool) and the generation's KV reservation moves to the healthy target
with room for it (router.admission.Admission.move). Each generation fails over at most
(number of targets - 1) times. With one target, or none healthy with room, the client gets a clean
UNAVAILABLE saying how far the generation got. Other failures (INVALID_ARGUMENT, INTERNAL for a
failed step, RESOURCE_EXHAUSTED) are the request's own and are passed on as they are.
"""
from __future__ import annotations

import dataclasses
import logging
import time
import uuid
from typing import Iterator, NamedTuple

import grpc

from specdec.core.types import GenerationStats, SamplingParams, tally_accepted
from specdec.errors import ServerError, Unavailable
from specdec.keys import new_key
from specdec.rpc.convert import params_to_pb, stats_to_pb
from specdec.rpc.v1 import generation_pb2, target_pb2
from specdec.telemetry_trace import RequestTrace

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 2.0
NO_DEADLINE_S = 1e8  # grpc reports "no deadline" as a huge time remaining


def time_remaining(call) -> float | None:
    """Seconds left of the client's deadline, None without one (passed on to every downstream call)."""
    left = call.time_remaining()
    return None if left is None or left > NO_DEADLINE_S else left


class SequenceKeys(NamedTuple):
    """The secrets of one sequence (specdec.keys): `owner` stays here, `draft` goes to its draft worker."""
    owner: str
    draft: str


class Tally:
    """What the client has been sent so far, across targets: tokens, text, and step statistics."""

    def __init__(self, prompt_ids: list[int]):
        self.prompt_ids = prompt_ids
        self.start = time.perf_counter()
        self.token_ids: list[int] = []
        self.texts: list[str] = []
        self.forwards = self.drafted = self.accepted = self.num_drafts = 0
        self.verify_s = self.prefill_s = 0.0
        self.accepted_per_pos: list[int] = []
        self.num_failovers = 0

    def response(self, commit: target_pb2.Commit, trace: RequestTrace) -> generation_pb2.GenerateResponse:
        """The client's message for one commit (with `final` on the last), counted as sent."""
        self.texts.append(commit.text)
        self.token_ids += commit.token_ids
        self.forwards += 1
        self.drafted += commit.num_drafted
        self.accepted += commit.num_accepted
        self.verify_s += commit.verify_s
        self.num_drafts += commit.num_drafted > 0
        tally_accepted(self.accepted_per_pos, commit.num_accepted)
        trace.commit(len(commit.token_ids), commit.num_drafted, commit.num_accepted)
        response = generation_pb2.GenerateResponse(text=commit.text, token_ids=commit.token_ids)
        if commit.finish_reason:
            stats = GenerationStats(len(self.token_ids), self.forwards, self.drafted, self.accepted,
                                    time.perf_counter() - self.start, 0.0, self.verify_s, self.prefill_s,
                                    self.num_drafts, tuple(self.accepted_per_pos))
            trace.finish(stats, commit.finish_reason)
            response.final.CopyFrom(generation_pb2.FinalInfo(
                finish_reason=commit.finish_reason, stats=stats_to_pb(stats), prompt_token_ids=self.prompt_ids,
                text="".join(self.texts)))
        return response


def remaining_params(params: SamplingParams, num_streamed: int) -> SamplingParams:
    """A draft worker joining a resumed generation sees prompt + streamed tokens as its prompt: the
    tokens left to generate are what it plans its drafts' depth with."""
    return dataclasses.replace(params, max_new_tokens=params.max_new_tokens - num_streamed)


class Relay:
    """Runs one admitted generation (the dispatcher's ticket) to its end, failing over as needed.
    `router` is the Dispatcher: its worker pools, admission, and draft worker helpers."""

    def __init__(self, router, ticket, prompt_ids: list[int], params: SamplingParams, call, trace: RequestTrace):
        self.router, self.ticket, self.params, self.call, self.trace = router, ticket, params, call, trace
        self.prompt_ids = prompt_ids
        self.tally = Tally(prompt_ids)

    def run(self) -> Iterator[generation_pb2.GenerateResponse]:
        max_attempts = len(self.router.targets.workers)
        while True:
            target = self.router.targets.workers[self.ticket.target]
            try:
                yield from self._on_target(target)
                return
            except grpc.RpcError as exc:
                if exc.code() != grpc.StatusCode.UNAVAILABLE:
                    raise
                self.router.targets.bench(target)
                if not self._may_continue():
                    raise
                lost = (f"target worker {target.address} failed after {len(self.tally.token_ids)} generated tokens "
                        f"({exc.code().name}: {exc.details()})")
                if self.tally.num_failovers + 1 >= max_attempts:
                    raise Unavailable(f"{lost}, and there is no other target worker to continue on") from None
                try:
                    self.router.admission.move(self.ticket)
                except Unavailable as refused:
                    raise Unavailable(f"{lost}; it cannot continue elsewhere: {refused}") from None
                self.tally.num_failovers += 1
                log.warning("%s: continuing on %s", lost, self.router.targets.workers[self.ticket.target].address)

    def _may_continue(self) -> bool:
        left = time_remaining(self.call)
        return self.call.is_active() and (left is None or left > 0)

    def _on_target(self, target) -> Iterator[generation_pb2.GenerateResponse]:
        """The generation on one target, from what the client has already been sent."""
        router, call, tally = self.router, self.call, self.tally
        remaining = time_remaining(call)
        draft = router.draft_worker(call)
        self.trace.admitted(target.address, draft.address if draft is not None else "")
        seq_id = uuid.uuid4().hex
        keys = SequenceKeys(new_key(), new_key())  # release ours only; drafts from the attached worker only
        resumed = list(tally.token_ids)
        admit = target.stub.Admit(target_pb2.AdmitRequest(
            sequence_id=seq_id, prompt_ids=self.prompt_ids, params=params_to_pb(self.params),
            expect_drafts=draft is not None, owner_key=keys.owner, draft_key=keys.draft, resumed_ids=resumed),
            timeout=remaining, metadata=self.trace.metadata())
        call.add_callback(admit.cancel)  # client gone -> the target's Admit ends -> sequence released there
        try:
            admitted = next(admit, None)  # prefill done
            if admitted is None:
                raise ServerError(f"target worker {target.address} ended the sequence before admitting it")
            tally.prefill_s += admitted.prefill_s
            if draft is not None:
                with self.trace.use():
                    draft = router.attach_draft(draft, target.address, seq_id, keys, self.prompt_ids + resumed,
                                                remaining_params(self.params, len(resumed)), call)
            for commit in admit:
                yield tally.response(commit, self.trace)  # counted as sent before it is
                if commit.finish_reason:
                    return
            raise ServerError("the target worker ended the sequence without finishing it")
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # full beyond this router's ledger
                router.refresh_target(self.ticket.target, RELEASE_TIMEOUT_S)
            raise
        finally:
            admit.cancel()
            router.release_at(target, seq_id, keys.owner)
            if draft is not None:
                router.release_at(draft, seq_id, keys.owner)
                router.drafts.release(draft)
