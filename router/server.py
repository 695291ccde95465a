"""The router's Generation servicer: validate, admit, assign, stream; release on every exit path."""
from __future__ import annotations

import argparse
import logging
import time
import uuid

import grpc

from router.admission import Admission
from router.pool import WorkerPool
from router.prompts import PromptEncoder
from specdec.core.types import GenerationStats
from specdec.errors import InvalidArgument, ServerError, Unavailable
from specdec.rpc.convert import params_from_pb, params_to_pb, prompt_from_pb, stats_to_pb
from specdec.rpc.server import run_until_signalled, start_server
from specdec.rpc.v1 import (common_pb2, draft_pb2, draft_pb2_grpc, generation_pb2, generation_pb2_grpc, target_pb2,
                            target_pb2_grpc)
from specdec.serving_config import RouterConfig, add_config_args, config_from_args

log = logging.getLogger(__name__)
RELEASE_TIMEOUT_S = 2.0
TARGET_INFO_TIMEOUT_S = 2.0
MAX_USER_LEN = 256
NO_DEADLINE_S = 1e8  # grpc reports "no deadline" as a huge time remaining


def time_remaining(context) -> float | None:
    """Seconds left of the client's deadline, None without one (passed on to every downstream call)."""
    left = context.time_remaining()
    return None if left is None or left > NO_DEADLINE_S else left


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    def __init__(self, config: RouterConfig, target_info: common_pb2.WorkerInfo):
        self.config = config
        self.target_info = target_info
        self.targets = WorkerPool(config.targets, target_pb2_grpc.TargetWorkerStub)
        # a target that drafts for itself (Medusa, EAGLE, ...) gets no draft worker
        self.drafts = WorkerPool(() if target_info.drafter else config.drafts, draft_pb2_grpc.DraftWorkerStub)
        self.admission = Admission(config.max_active, config.max_queue, len(config.targets),
                                   config.max_active_per_user, config.max_queued_per_user,
                                   is_healthy=lambda index: self.targets.workers[index].healthy)
        self.admission.update_target(0, target_info.kv_capacity_tokens, target_info.max_sequences)
        for index in range(1, len(config.targets)):
            self._refresh_target(index, TARGET_INFO_TIMEOUT_S)
        self.encoder = PromptEncoder(config.tokenizer or target_info.model_path, target_info.vocab_size)

    def Generate(self, request, context):
        params = params_from_pb(request.params)
        prompt_ids = self.encoder.encode(prompt_from_pb(request), request.chat)
        max_len = self.target_info.max_context_len
        if max_len and len(prompt_ids) + params.max_new_tokens > max_len:
            raise InvalidArgument(f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({params.max_new_tokens}) "
                                  f"exceeds the model's context of {max_len} tokens")
        if params.stop and self.encoder.tokenizer is None:
            raise InvalidArgument("stop strings need a model with a tokenizer")
        if len(request.user) > MAX_USER_LEN:
            raise InvalidArgument(f"user is {len(request.user)} characters long; the limit is {MAX_USER_LEN}")
        ticket = self.admission.acquire(context.is_active, lambda: time_remaining(context),
                                        request.user or context.peer(), len(prompt_ids) + params.max_new_tokens)
        try:
            yield from self._generate(ticket.target, prompt_ids, params, context)
        finally:
            self.admission.release(ticket)

    def _generate(self, target_index, prompt_ids, params, context):
        start = time.perf_counter()
        target = self.targets.workers[target_index]
        draft = self.drafts.acquire()
        seq_id = uuid.uuid4().hex
        call = target.stub.Admit(target_pb2.AdmitRequest(
            sequence_id=seq_id, prompt_ids=prompt_ids, params=params_to_pb(params), expect_drafts=draft is not None),
            timeout=time_remaining(context))
        context.add_callback(call.cancel)  # client gone -> the target's Admit ends -> sequence released there
        try:
            admitted = next(call)  # prefill done
            if draft is not None:
                draft = self._attach(draft, target.address, seq_id, prompt_ids, params, context)
            yield from self._relay(call, admitted.prefill_s, prompt_ids, start)
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.targets.bench(target)
            elif exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:  # full beyond this router's ledger
                self._refresh_target(target_index, RELEASE_TIMEOUT_S)
            raise
        finally:
            call.cancel()
            self._release(target, seq_id)
            if draft is not None:
                self._release(draft, seq_id)
                self.drafts.release(draft)

    def _attach(self, draft, target_address, seq_id, prompt_ids, params, context):
        """Assign the draft worker; without it the target simply decodes alone."""
        remaining = time_remaining(context)
        try:
            draft.stub.Attach(draft_pb2.AttachRequest(
                sequence_id=seq_id, target_address=target_address, prompt_ids=prompt_ids,
                params=params_to_pb(params), timeout_s=remaining or 0.0),
                timeout=min(self.config.worker_timeout_s, remaining or self.config.worker_timeout_s))
            return draft
        except grpc.RpcError as exc:
            log.warning("draft worker %s failed (%s): decoding without drafts", draft.address, exc.code())
            self.drafts.bench(draft)
            self.drafts.release(draft)
            return None

    def _relay(self, call, prefill_s, prompt_ids, start):
        texts, num_tokens, forwards, drafted, accepted, verify_s = [], 0, 0, 0, 0, 0.0
        for commit in call:
            texts.append(commit.text)
            num_tokens += len(commit.token_ids)
            forwards += 1
            drafted += commit.num_drafted
            accepted += commit.num_accepted
            verify_s += commit.verify_s
            response = generation_pb2.GenerateResponse(text=commit.text, token_ids=commit.token_ids)
            if commit.finish_reason:
                stats = GenerationStats(num_tokens, forwards, drafted, accepted, time.perf_counter() - start,
                                        0.0, verify_s, prefill_s)
                response.final.CopyFrom(generation_pb2.FinalInfo(
                    finish_reason=commit.finish_reason, stats=stats_to_pb(stats), prompt_token_ids=prompt_ids,
                    text="".join(texts)))
                yield response
                return
            yield response
        raise ServerError("the target worker ended the sequence without finishing it")

    def _release(self, worker, seq_id: str) -> None:
        try:
            worker.stub.Release(common_pb2.ReleaseRequest(sequence_id=seq_id), timeout=RELEASE_TIMEOUT_S)
        except grpc.RpcError as exc:
            log.warning("release of %s at %s failed: %s", seq_id, worker.address, exc.code())

    def _refresh_target(self, index: int, timeout_s: float) -> common_pb2.WorkerInfo | None:
        """Ask a target for its KV capacity and slots (what admission plans with); None if it did not answer."""
        worker = self.targets.workers[index]
        try:
            info = worker.stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=timeout_s)
        except grpc.RpcError as exc:
            log.warning("target %s did not report its capacity: %s", worker.address, exc.code())
            return None
        self.admission.update_target(index, info.kv_capacity_tokens, info.max_sequences)
        return info

    def GetServerInfo(self, request, context):
        info = generation_pb2.ServerInfo(
            version=package_version(), model_path=self.target_info.model_path,
            vocab_size=self.target_info.vocab_size, max_context_len=self.target_info.max_context_len,
            max_active=self.config.max_active, max_queue=self.config.max_queue,
            max_active_per_user=self.config.max_active_per_user, max_queued_per_user=self.config.max_queued_per_user)
        for index, worker in enumerate(self.targets.workers):
            reported = self._refresh_target(index, TARGET_INFO_TIMEOUT_S)
            status = info.targets.add(address=worker.address, healthy=worker.healthy and reported is not None)
            if reported is not None:
                status.info.CopyFrom(reported)
                info.kv_used_tokens += reported.kv_used_tokens
                info.num_verify_forwards += reported.num_verify_forwards
                info.num_sequence_steps += reported.num_sequence_steps
                info.max_batch_seen = max(info.max_batch_seen, reported.max_batch_seen)
        for worker in self.drafts.workers:
            status = info.drafts.add(address=worker.address, healthy=worker.healthy)
            try:
                status.info.CopyFrom(worker.stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                                               timeout=TARGET_INFO_TIMEOUT_S))
            except grpc.RpcError:
                status.healthy = False
        if info.num_verify_forwards:
            info.mean_batch_size = info.num_sequence_steps / info.num_verify_forwards
        _add_admission_figures(info, self.admission.figures())  # after the refresh: capacities are current
        return info


def _add_admission_figures(info: generation_pb2.ServerInfo, figures) -> None:
    info.num_active, info.num_queued = figures.num_active, figures.num_queued
    info.num_admitted, info.num_rejected, info.num_abandoned = (figures.num_admitted, figures.num_rejected,
                                                                 figures.num_abandoned)
    info.queue_wait_p50_s, info.queue_wait_p99_s = figures.wait_p50_s, figures.wait_p99_s
    info.kv_capacity_tokens, info.kv_reserved_tokens = figures.kv_capacity_tokens, figures.kv_reserved_tokens
    for user, (active, queued) in sorted(figures.users.items()):
        info.users.add(user=user, num_active=active, num_queued=queued)
        info.num_users_waiting += queued > 0


def package_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specdec")
    except PackageNotFoundError:
        return "unknown"


def fetch_target_info(address: str, timeout_s: float) -> common_pb2.WorkerInfo:
    """Ask the first target what it serves (vocabulary, context, model dir for the tokenizer)."""
    from specdec.rpc.server import channel_options

    with grpc.insecure_channel(address, options=channel_options()) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
            return target_pb2_grpc.TargetWorkerStub(channel).GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                                                           timeout=timeout_s)
        except (grpc.RpcError, grpc.FutureTimeoutError) as exc:
            raise Unavailable(f"target worker {address} did not answer: {exc}") from exc


def serve(config: RouterConfig) -> int:
    if not config.targets:
        raise InvalidArgument("the router needs at least one --targets HOST:PORT")
    servicer = GenerationServicer(config, fetch_target_info(config.targets[0], config.worker_timeout_s))
    running = start_server(lambda s: generation_pb2_grpc.add_GenerationServicer_to_server(servicer, s),
                           ["specdec.v1.Generation"], config.port)
    return run_until_signalled(running, "router")



def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m router")
    add_config_args(parser, RouterConfig)
    return serve(config_from_args(parser.parse_args(argv), RouterConfig))
