"""One generation through the router: validate, admit, assign workers, relay commits, release.

The gRPC servicer and the OpenAI-compatible HTTP API both only convert their wire format to a
`GenerateRequest` and hand it here with their call, so every request, whichever door it came
through, waits in the same fair queue, counts against the same KV ledger and limits, and runs on
the same batches. A call is anything with the four methods of `Call` (a grpc.ServicerContext has
them; router.http_api.HttpCall implements them for an HTTP request).
"""
from __future__ import annotations

import logging
import os
from typing import Callable, Iterator, Protocol

import grpc

from router.admission import Admission
from router.discovery import WorkerSet
from router.limits import check_request, derive_limits
from router.pool import WorkerPool
from router.prompts import PromptEncoder
from router.relay import RELEASE_TIMEOUT_S, Relay, SequenceKeys, time_remaining
from router.tokenize_pool import TokenizePool
from specdec.errors import InvalidArgument, Unavailable
from specdec.keys import new_key
from specdec.rpc.convert import params_from_pb, params_to_pb, prompt_from_pb
from specdec.rpc.v1 import common_pb2, draft_pb2, draft_pb2_grpc, generation_pb2, target_pb2_grpc
from specdec.serving_config import RouterConfig
from specdec.telemetry import Telemetry
from specdec.telemetry_trace import RequestTrace, RouterInstruments

log = logging.getLogger(__name__)
TARGET_INFO_TIMEOUT_S = 2.0
PROBE_TIMEOUT_S = 1.0  # a draft worker back from the bench must answer this fast to be used
MAX_USER_LEN = 256


class Call(Protocol):
    def is_active(self) -> bool: ...  # False once the client cancelled or went away
    def time_remaining(self) -> float | None: ...  # seconds to the client's deadline; None (or huge): none
    def add_callback(self, callback: Callable[[], None]) -> bool: ...  # run when the call ends
    def peer(self) -> str: ...  # who is calling: the fairness key of anonymous requests


class Dispatcher:
    def __init__(self, config: RouterConfig, target_info: common_pb2.WorkerInfo, telemetry: Telemetry | None = None,
                 workers: WorkerSet | None = None):
        """workers: the addresses discovery found at start (router.discovery); None = config's lists."""
        workers = workers or WorkerSet(config.targets, config.drafts)
        self.config = config
        self.target_info = target_info
        self.telemetry = telemetry or Telemetry.off()
        self.model_name = os.path.basename(os.path.normpath(target_info.model_path)) or "model"
        self.draining = False  # SIGTERM: no new request; the running and queued ones finish
        self.targets = WorkerPool(workers.targets, target_pb2_grpc.TargetWorkerStub, wrap=self.telemetry.traced_channel,
                                  security=config.security)
        # a target that drafts for itself (Medusa, EAGLE, ...) gets no draft worker
        self.drafts = WorkerPool(() if target_info.drafter else workers.drafts, draft_pb2_grpc.DraftWorkerStub,
                                 wrap=self.telemetry.traced_channel, security=config.security)
        self.admission = Admission(config.max_active, config.max_queue, len(workers.targets),
                                   config.max_active_per_user, config.max_queued_per_user,
                                   is_healthy=lambda index: self.targets.workers[index].healthy)
        self.admission.update_target(0, target_info.kv_capacity_tokens, target_info.max_sequences)
        for index in range(1, len(workers.targets)):
            self.refresh_target(index, TARGET_INFO_TIMEOUT_S)
        self.encoder = PromptEncoder(config.tokenizer or target_info.model_path, target_info.vocab_size)
        self.limits = derive_limits(target_info.max_context_len, self.encoder.longest_token_bytes(),
                                    config.max_prompt_bytes, config.max_stop_strings, config.max_stop_bytes,
                                    config.max_messages)
        self.tokenizing = TokenizePool(self.encoder, config.tokenize_threads)
        self.instruments = RouterInstruments(self.telemetry.metrics, self.admission)

    def sync_workers(self, found: WorkerSet) -> None:
        """Discovery's current set (router.discovery): new targets report their capacity before they get
        work, vanished ones get none (their running sequences end as their streams do)."""
        joined, left = self.targets.sync(found.targets)
        for index in joined:
            while len(self.admission.rooms) <= index:
                self.admission.add_target()
            self.refresh_target(index, TARGET_INFO_TIMEOUT_S)
            self.admission.set_retired(index, False)
        for index in left:
            self.admission.set_retired(index, True)
        if not self.target_info.drafter:
            self.drafts.sync(found.drafts)

    def any_target_healthy(self) -> bool:
        return not self.draining and any(worker.healthy for worker in self.targets.workers)

    def begin_drain(self) -> None:
        """Take no new request (UNAVAILABLE); what is running or queued goes on to its end."""
        self.draining = True

    def num_running(self) -> int:
        return sum(self.admission.counts())

    def close(self) -> None:
        self.targets.close()
        self.drafts.close()

    def generate(self, request: generation_pb2.GenerateRequest, call: Call,
                 fill_context: bool = False) -> Iterator[generation_pb2.GenerateResponse]:
        """Stream one generation. `fill_context`: an unset max_new_tokens means the rest of the context
        (what OpenAI's chat API promises; at most what a target's KV cache can hold) instead of
        SamplingParams' default."""
        if self.draining:
            raise Unavailable("this router is draining (shutting down): send the request to another router")
        check_request(request, self.limits)  # by size, before anything is copied or tokenized
        prompt_ids = self.tokenizing.encode(prompt_from_pb(request), request.chat, call.is_active,
                                            lambda: time_remaining(call))
        max_len = self.target_info.max_context_len
        if fill_context and not request.params.HasField("max_new_tokens"):
            room = [n for n in (max_len, self.admission.largest_request_tokens()) if n]
            if room:  # the rest of the context, or of the largest KV cache if that is smaller
                request.params.max_new_tokens = max(min(room) - len(prompt_ids), 1)
        params = params_from_pb(request.params)
        if max_len and len(prompt_ids) + params.max_new_tokens > max_len:
            raise InvalidArgument(f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({params.max_new_tokens}) "
                                  f"exceeds the model's context of {max_len} tokens")
        if params.stop and self.encoder.tokenizer is None:
            raise InvalidArgument("stop strings need a model with a tokenizer")
        if len(request.user) > MAX_USER_LEN:
            raise InvalidArgument(f"user is {len(request.user)} characters long; the limit is {MAX_USER_LEN}")
        chat = request.chat or request.WhichOneof("prompt") == "messages"
        trace = RequestTrace(self.telemetry, self.instruments, "chat" if chat else "text_completion", self.model_name,
                             params, len(prompt_ids))
        error = None
        try:
            with trace.queue():
                ticket = self.admission.acquire(call.is_active, lambda: time_remaining(call),
                                                request.user or call.peer(), len(prompt_ids) + params.max_new_tokens)
            try:  # on the ticket's target, and on another if that one dies
                yield from Relay(self, ticket, prompt_ids, params, call, trace).run()
            finally:
                self.admission.release(ticket)
        except Exception as exc:
            error = exc
            raise
        finally:
            trace.end(error)

    def draft_worker(self, call: Call):
        """A draft worker for the next sequence, or None. One back from the bench is asked first
        whether it is alive: the target would otherwise wait `draft_wait_s` for drafts that never come."""
        draft = self.drafts.acquire()
        if draft is None or not draft.on_probation:
            return draft
        remaining = time_remaining(call)
        try:
            draft.stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                     timeout=min(PROBE_TIMEOUT_S, remaining or PROBE_TIMEOUT_S))
        except grpc.RpcError as exc:
            log.warning("draft worker %s still down (%s): decoding without drafts", draft.address, exc.code())
            self.drafts.bench(draft)
            self.drafts.release(draft)
            return None
        self.drafts.cleared(draft)
        return draft

    def attach_draft(self, draft, target_address, seq_id, keys: SequenceKeys, prompt_ids, params, call: Call):
        """Assign the draft worker; without it the target simply decodes alone."""
        remaining = time_remaining(call)
        try:
            draft.stub.Attach(draft_pb2.AttachRequest(
                sequence_id=seq_id, target_address=target_address, prompt_ids=prompt_ids,
                params=params_to_pb(params), timeout_s=remaining or 0.0, owner_key=keys.owner, draft_key=keys.draft),
                timeout=min(self.config.worker_timeout_s, remaining or self.config.worker_timeout_s))
            return draft
        except grpc.RpcError as exc:
            log.warning("draft worker %s failed (%s): decoding without drafts", draft.address, exc.code())
            self.drafts.bench(draft)
            self.drafts.release(draft)
            return None

    def release_at(self, worker, seq_id: str, owner_key: str) -> None:
        try:
            worker.stub.Release(common_pb2.ReleaseRequest(sequence_id=seq_id, owner_key=owner_key),
                                timeout=RELEASE_TIMEOUT_S)
        except grpc.RpcError as exc:
            log.warning("release of %s at %s failed: %s", seq_id, worker.address, exc.code())

    def refresh_target(self, index: int, timeout_s: float) -> common_pb2.WorkerInfo | None:
        """Ask a target for its KV capacity and slots (what admission plans with); None if it did not answer."""
        worker = self.targets.workers[index]
        try:
            info = worker.stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            log.warning("target %s did not report its capacity: %s", worker.address, exc.code())
            return None
        self.admission.update_target(index, info.kv_capacity_tokens, info.max_sequences)
        return info
