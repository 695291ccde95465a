"""The router process: the gRPC Generation service and the OpenAI-compatible HTTP API over one dispatcher."""
from __future__ import annotations

import argparse
import logging

import grpc

from router.api_keys import ApiKeyInterceptor, ApiKeys
from router.discovery import Discovery
from router.dispatcher import TARGET_INFO_TIMEOUT_S, Dispatcher
from router.oversize import OversizeInterceptor
from specdec.errors import InvalidArgument, Unavailable
from specdec.rpc.security import open_channel
from specdec.rpc.server import Drain, run_until_signalled, start_server
from specdec.rpc.v1 import common_pb2, generation_pb2, generation_pb2_grpc, target_pb2_grpc
from specdec.security_config import SecurityConfig
from specdec.config_fields import add_config_args, config_from_args
from specdec.serving_config import RouterConfig
from specdec.telemetry import setup as setup_telemetry


class GenerationServicer(generation_pb2_grpc.GenerationServicer):
    """Converts only: the dispatcher does the work for this door and for the HTTP API alike."""

    def __init__(self, dispatcher: Dispatcher, keys: ApiKeys):
        self.dispatcher, self.keys = dispatcher, keys
        self.config, self.target_info = dispatcher.config, dispatcher.target_info

    def Generate(self, request, context):
        yield from self.dispatcher.generate(request, context)

    def GetServerInfo(self, request, context):
        info = self._server_info()
        if not self.keys.shows_details(dict(context.invocation_metadata()).get("authorization")):
            withhold_details(info)
        return info

    def _server_info(self) -> generation_pb2.ServerInfo:
        info = generation_pb2.ServerInfo(
            version=package_version(), model_path=self.target_info.model_path,
            vocab_size=self.target_info.vocab_size, max_context_len=self.target_info.max_context_len,
            max_active=self.config.max_active, max_queue=self.config.max_queue,
            max_active_per_user=self.config.max_active_per_user, max_queued_per_user=self.config.max_queued_per_user)
        dispatcher = self.dispatcher
        for index, worker in enumerate(dispatcher.targets.workers):
            if worker.gone:  # discovery no longer lists it
                continue
            reported = dispatcher.refresh_target(index, TARGET_INFO_TIMEOUT_S)
            status = info.targets.add(address=worker.address, healthy=worker.healthy and reported is not None)
            if reported is not None:
                status.info.CopyFrom(reported)
                info.kv_used_tokens += reported.kv_used_tokens
                info.num_verify_forwards += reported.num_verify_forwards
                info.num_sequence_steps += reported.num_sequence_steps
                info.max_batch_seen = max(info.max_batch_seen, reported.max_batch_seen)
        for worker in dispatcher.drafts.workers:
            if worker.gone:
                continue
            status = info.drafts.add(address=worker.address, healthy=worker.healthy)
            try:
                status.info.CopyFrom(worker.stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                                               timeout=TARGET_INFO_TIMEOUT_S))
            except grpc.RpcError:
                status.healthy = False
        if info.num_verify_forwards:
            info.mean_batch_size = info.num_sequence_steps / info.num_verify_forwards
        _add_admission_figures(info, dispatcher.admission.figures())  # after the refresh: capacities are current
        return info


def withhold_details(info: generation_pb2.ServerInfo) -> None:
    """What only an admin key may see: where the workers are, which sequences they hold, who asks."""
    for status in (*info.targets, *info.drafts):
        status.address = ""
        del status.info.sequence_ids[:]
    del info.users[:]


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


def fetch_target_info(address: str, timeout_s: float, security: SecurityConfig = SecurityConfig()
                      ) -> common_pb2.WorkerInfo:
    """Ask the first target what it serves (vocabulary, context, model dir for the tokenizer)."""
    from specdec.rpc.server import channel_options

    with open_channel(address, security, channel_options()) as channel:
        try:
            grpc.channel_ready_future(channel).result(timeout=timeout_s)
            return target_pb2_grpc.TargetWorkerStub(channel).GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                                                           timeout=timeout_s)
        except (grpc.RpcError, grpc.FutureTimeoutError) as exc:
            raise Unavailable(f"target worker {address} did not answer: {exc}") from exc


def serve(config: RouterConfig) -> int:
    if not config.targets and config.workers_file is None:
        raise InvalidArgument("the router needs at least one --targets HOST:PORT (or a --workers-file)")
    discovery = Discovery(config.targets, config.drafts, config.workers_file, config.discovery_interval_s)
    workers = discovery.find()
    if not workers.targets:
        raise Unavailable(f"no target worker found (targets {list(config.targets)}, workers file "
                          f"{config.workers_file})")
    keys = ApiKeys.load(config.api_keys_file, admin_path=config.admin_keys_file,
                        secured=config.security.enabled())
    telemetry = setup_telemetry("router", config.metrics_port, config.host)
    target_info = fetch_target_info(workers.targets[0], config.worker_timeout_s, config.security)
    dispatcher = Dispatcher(config, target_info, telemetry, workers)
    discovery.start(workers, dispatcher.sync_workers)
    servicer = GenerationServicer(dispatcher, keys)
    interceptors = [*telemetry.server_interceptors(), *([ApiKeyInterceptor(keys)] if keys.enabled else ()),
                    OversizeInterceptor(dispatcher.limits)]  # after the key check: strangers are refused first
    running = start_server(lambda s: generation_pb2_grpc.add_GenerationServicer_to_server(servicer, s),
                           ["specdec.v1.Generation"], config.port, host=config.host, interceptors=interceptors,
                           max_receive_bytes=dispatcher.limits.max_receive_bytes, security=config.security,
                           internal=False, advertise_host=config.advertise_host, kind="router")
    http = None
    if config.http_port >= 0:
        from router.http_api import start_http

        try:
            http = start_http(dispatcher, keys, config.http_port, config.host, config.advertise_host,
                              config.security)
        except BaseException:
            running.stop()
            raise
    drain = Drain(dispatcher.begin_drain, dispatcher.num_running, config.drain_timeout_s)
    return run_until_signalled(running, "router",
                               on_stop=lambda: (discovery.stop(), http and http.stop(), dispatcher.close()),
                               ready_detail=f"; http on {http.address}" if http else "", telemetry=telemetry,
                               drain_plan=drain)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m router")
    add_config_args(parser, RouterConfig)
    return serve(config_from_args(parser.parse_args(argv), RouterConfig))
