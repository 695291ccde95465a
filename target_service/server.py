"""gRPC servicer of the target worker: converts messages and calls TargetWorker, nothing more."""
from __future__ import annotations

import argparse
import logging
import queue
import threading

import grpc

from specdec.rpc.convert import params_from_pb
from specdec.rpc.server import Drain, run_until_signalled, start_server
from specdec.rpc.v1 import common_pb2, target_pb2_grpc
from specdec.config_fields import add_config_args, config_from_args
from specdec.serving_config import TargetConfig
from specdec.telemetry import setup as setup_telemetry
from target_service.worker import TargetWorker

POLL_S = 0.5  # how often a blocked stream checks that its call is still alive
# Threads for short calls (Release, GetWorkerInfo, health, refusals) beyond the long-lived streams.
SHORT_CALL_THREADS = 16
# Routers' health Watch streams (router/health_watch.py), one per router, each holding a thread.
WATCH_THREADS = 8


def rpc_threads(config: TargetConfig) -> int:
    """gRPC threads, and the most calls in progress at once. Every long-lived stream is bounded (one
    Admit per admitted sequence, one Verify per draft link, a health Watch per router), and these
    bounds leave SHORT_CALL_THREADS free: no caller holding streams, however many it opens, can take the
    thread a router's call needs. Beyond the total a call is refused at once (RESOURCE_EXHAUSTED)
    rather than left waiting."""
    return config.max_sequences + config.max_draft_links + WATCH_THREADS + SHORT_CALL_THREADS


class TargetServicer(target_pb2_grpc.TargetWorkerServicer):
    def __init__(self, worker: TargetWorker):
        self.worker = worker

    def Admit(self, request, context):
        params = params_from_pb(request.params)
        state = self.worker.admit(request.sequence_id, list(request.prompt_ids), params, request.expect_drafts,
                                  request.owner_key, request.draft_key, list(request.resumed_ids))
        context.add_callback(lambda: self.worker.release(request.sequence_id))  # cancel, deadline or end
        yield from _drain(state.outbox, context)  # first the version-0 message, once prefilled

    def Release(self, request, context):
        return common_pb2.ReleaseResponse(released=self.worker.release(request.sequence_id, request.owner_key))

    def Verify(self, request_iterator, context):
        link = self.worker.open_link()

        def read() -> None:
            try:
                for message in request_iterator:
                    self.worker.offer_draft(link, message)
            except grpc.RpcError:
                pass  # the draft worker went away
            finally:
                self.worker.drop_link(link)

        context.add_callback(lambda: self.worker.drop_link(link))
        threading.Thread(target=read, name="draft-link", daemon=True).start()
        yield from _drain(link.outbox, context)

    def GetWorkerInfo(self, request, context):
        ids, served = self.worker.info()
        engine = self.worker.engine
        return common_pb2.WorkerInfo(kind="target", model_path=str(engine.target.path),
                                     vocab_size=engine.runner.vocab_size, max_context_len=engine.max_len,
                                     sequence_ids=ids, num_served=served,
                                     max_tree_nodes=self.worker.config.max_tree_nodes,
                                     num_verify_forwards=self.worker.num_verify_forwards,
                                     num_sequence_steps=self.worker.num_sequence_steps,
                                     max_batch_seen=self.worker.max_batch_seen,
                                     max_batch=self.worker.config.max_batch,
                                     tp_degree=self.worker.config.tp,
                                     drafter="" if engine.drafter is None else self.worker.config.drafter,
                                     device=str(engine.runner.device),
                                     dtype=str(engine.runner.dtype).removeprefix("torch."),
                                     kv_capacity_source=self.worker.kv_budget.source,
                                     kv_bytes_per_token=self.worker.kv_budget.bytes_per_token,
                                     **_kv_fields(self.worker.kv_figures()), **_prefix_fields(engine.runner.prefix_cache))


def _prefix_fields(prefixes) -> dict:
    """The prompt-prefix cache's figures, as WorkerInfo fields (zeros when it is off)."""
    if prefixes is None:
        return {}
    return dict(prefix_cache_bytes=prefixes.num_bytes, prefix_cache_looked_up_tokens=prefixes.num_looked_up_tokens,
                prefix_cache_hit_tokens=prefixes.num_hit_tokens)


def _kv_fields(kv) -> dict:
    """KV budget and sequence slots, as WorkerInfo fields (what the router's admission plans with)."""
    return dict(kv_capacity_tokens=kv.capacity_tokens, kv_reserved_tokens=kv.reserved_tokens,
                kv_used_tokens=kv.used_tokens, num_sequences=kv.num_sequences, max_sequences=kv.max_sequences,
                num_refused=kv.num_refused)


def _drain(outbox: queue.Queue, context):
    """Yield queued messages until the None sentinel or the call ends."""
    while context.is_active():
        try:
            item = outbox.get(timeout=POLL_S)
        except queue.Empty:
            continue
        if item is None:
            return
        if isinstance(item, Exception):  # the sequence failed: its status (INTERNAL, UNAVAILABLE)
            raise item
        yield item


def serve(config: TargetConfig) -> int:
    """One target worker; with --tp N, rank 0 of N processes (started here unless torchrun started them)."""
    import os

    import torch

    from specdec.drafters import build_drafter, parse_options
    from specdec.engine import Engine, EngineConfig
    from specdec import kv_budget
    from specdec.device import placement
    from specdec.models.loader import load_model
    from specdec.models.runner import RunnerConfig
    from target_service import tp, tp_group

    if config.tp > 1 and "WORLD_SIZE" not in os.environ:  # the launcher: this same command as N ranks
        return tp_group.launch(config)
    device, dtype = placement(config.device, config.dtype, config.tp, target=config.model,  # refusals before any
                              linear_kernel=config.linear_kernel, kv_cache=config.kv_cache)  # weight loads
    rank = tp_group.join(config, device)
    if config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    loaded = load_model(config.model, dtype, tp_degree=config.tp, device=device)
    runner = RunnerConfig(kv_cache=config.kv_cache, cuda_graphs=config.cuda_graphs,
                          linear_kernel=config.linear_kernel, prefix_cache_mb=config.prefix_cache_mb)
    engine_config = EngineConfig(num_speculative_tokens=config.num_speculative_tokens, adaptive=config.adaptive,
                                 runner=runner)
    # a follower has no drafter, no gRPC, only rank 0's model calls
    options = parse_options(config.drafter, config.drafter_options)
    drafter = None if rank > 0 else build_drafter(config.drafter, loaded, config.draft, options, dtype,
                                                  RunnerConfig(kv_cache=config.kv_cache,
                                                               linear_kernel=config.linear_kernel))
    engine = Engine(loaded, drafter, engine_config)
    budget = kv_budget.plan(engine, config.max_sequences, config.max_kv_tokens, config.max_batch,
                            config.gpu_memory_fraction, config.tp)  # on GPUs a profiling forward: every rank
    if rank > 0:
        return tp.follow(engine)
    mirror = tp.Mirror(active=config.tp > 1)
    telemetry = setup_telemetry("target", config.metrics_port, config.host)
    worker = TargetWorker(engine, config, mirror, telemetry=telemetry, kv_budget=budget)
    mirror.start(worker.model_lock)
    running = start_server(lambda s: target_pb2_grpc.add_TargetWorkerServicer_to_server(TargetServicer(worker), s),
                           ["specdec.v1.TargetWorker"], config.port, host=config.host,
                           max_workers=rpc_threads(config), max_concurrent_rpcs=rpc_threads(config),
                           interceptors=telemetry.server_interceptors(), security=config.security,
                           advertise_host=config.advertise_host, kind="target")
    worker.on_broken = lambda: running.set_serving(False)
    drain = Drain(worker.begin_drain, worker.num_running, config.drain_timeout_s)
    return run_until_signalled(running, "target", on_stop=lambda: (worker.stop(), mirror.stop()), telemetry=telemetry,
                               drain_plan=drain)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m target_service")
    add_config_args(parser, TargetConfig)
    return serve(config_from_args(parser.parse_args(argv), TargetConfig))
