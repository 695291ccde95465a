"""gRPC servicer of the draft worker: converts messages and calls DraftWorker, nothing more."""
from __future__ import annotations

import argparse
import logging
from pathlib import Path
from types import SimpleNamespace

from specdec.rpc.convert import params_from_pb
from specdec.rpc.server import Drain, run_until_signalled, start_server
from specdec.rpc.v1 import common_pb2, draft_pb2, draft_pb2_grpc
from specdec.config_fields import add_config_args, config_from_args
from specdec.serving_config import DraftConfig
from specdec.telemetry import setup as setup_telemetry
from draft_service.worker import DraftWorker


class DraftServicer(draft_pb2_grpc.DraftWorkerServicer):
    def __init__(self, worker: DraftWorker, model_path: str, vocab_size: int):
        self.worker = worker
        self.model_path, self.vocab_size = model_path, vocab_size

    def Attach(self, request, context):
        self.worker.attach(request.sequence_id, request.target_address, list(request.prompt_ids),
                           params_from_pb(request.params), request.timeout_s, request.owner_key, request.draft_key)
        return draft_pb2.AttachResponse()

    def Release(self, request, context):
        return common_pb2.ReleaseResponse(released=self.worker.release(request.sequence_id, request.owner_key))

    def GetWorkerInfo(self, request, context):
        ids, served = self.worker.info()
        runner = getattr(self.worker.drafter, "runner", None)  # None: a drafter without a model (ngram, suffix)
        return common_pb2.WorkerInfo(kind="draft", model_path=self.model_path, vocab_size=self.vocab_size,
                                     sequence_ids=ids, drafter=self.worker.config.drafter, num_served=served,
                                     device=str(getattr(runner, "device", "")),
                                     dtype=str(getattr(runner, "dtype", "")).removeprefix("torch."))


def build_drafter(config: DraftConfig):
    """(drafter, model path, vocab size). The draft model is loaded without its target: only the
    target's config.json is read, to check that the vocabularies agree."""
    from specdec.drafters import parse_options

    options = parse_options(config.drafter, config.drafter_options)  # over the config's own fields
    if config.drafter == "ngram":
        from specdec.drafters.ngram import NgramConfig, NgramDrafter

        # Scores do not cross the wire (the target sizes a received tree by its one acceptance rate), so the
        # worker keeps the unscored rule that estimate was tuned on: 2-3-token matches, depth x width nodes.
        defaults = dict(max_ngram=3, min_ngram=2, num_branches=config.tree_width,
                        num_nodes=config.num_speculative_tokens * config.tree_width)
        return NgramDrafter(NgramConfig(**{**defaults, **options})), "", 0
    if config.drafter == "suffix":  # its global store of earlier outputs is this worker's own
        from specdec.drafters.suffix import SuffixConfig, SuffixDrafter

        return SuffixDrafter(SuffixConfig(**options)), "", 0
    from transformers import AutoConfig, AutoTokenizer

    from specdec.drafters import RANDOM_DRAFT, no_draft_model_reason
    from specdec.drafters.draft_model import DraftModelConfig, DraftModelDrafter
    from specdec.errors import InvalidArgument
    from specdec.device import placement
    from specdec.models.loader import load_model, random_draft_path, resolve_path
    from specdec.models.runner import ModelRunner, RunnerConfig, load_vocab_ids

    target_dir = resolve_path(config.target_model)
    target_config = AutoConfig.from_pretrained(target_dir, local_files_only=True)
    path = config.model
    if path is None:
        path = _shipped_draft(target_dir)
        if path is None:
            raise InvalidArgument(no_draft_model_reason(target_dir))
    elif path == RANDOM_DRAFT:  # random_draft_path reads only model.config and tokenizer
        try:
            tokenizer = AutoTokenizer.from_pretrained(target_dir, local_files_only=True)
        except (OSError, ValueError, TypeError):
            tokenizer = None
        path = random_draft_path(SimpleNamespace(model=SimpleNamespace(config=target_config), tokenizer=tokenizer))
    device, dtype = placement(config.device, config.dtype, target=path, linear_kernel=config.linear_kernel,
                              kv_cache=config.kv_cache)  # its own device: a small GPU, or the CPU
    draft = load_model(path, dtype, device=device)
    if draft.model.config.vocab_size != target_config.vocab_size:
        raise InvalidArgument(f"draft vocabulary ({draft.model.config.vocab_size}) differs from the target's "
                              f"({target_config.vocab_size})")
    drafter = DraftModelDrafter(ModelRunner(draft.model, load_vocab_ids(path), RunnerConfig(kv_cache=config.kv_cache,
                                                                                   linear_kernel=config.linear_kernel)),
                                DraftModelConfig(**{"tree_width": config.tree_width, "q_top_n": config.q_top_n,
                                                    **options}))
    return drafter, str(Path(path)), draft.model.config.vocab_size


def _shipped_draft(target_dir: Path) -> Path | None:
    """The distilled draft shipped for the embedded target, as the in-process engine picks it."""
    try:
        from specdec.drafters.trained import shipped_checkpoint
    except ImportError:
        return None
    return shipped_checkpoint("draft", SimpleNamespace(path=target_dir))


def serve(config: DraftConfig) -> int:
    import torch

    if config.num_threads > 0:
        torch.set_num_threads(config.num_threads)
    drafter, model_path, vocab_size = build_drafter(config)
    telemetry = setup_telemetry("draft", config.metrics_port, config.host)
    worker = DraftWorker(drafter, config, telemetry)
    servicer = DraftServicer(worker, model_path, vocab_size)
    running = start_server(lambda s: draft_pb2_grpc.add_DraftWorkerServicer_to_server(servicer, s),
                           ["specdec.v1.DraftWorker"], config.port, host=config.host,
                           interceptors=telemetry.server_interceptors(), security=config.security,
                           advertise_host=config.advertise_host, kind="draft")
    drain = Drain(worker.begin_drain, worker.num_running, config.drain_timeout_s)
    return run_until_signalled(running, "draft", on_stop=worker.stop, telemetry=telemetry, drain_plan=drain)


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.WARNING)
    parser = argparse.ArgumentParser(prog="python -m draft_service")
    add_config_args(parser, DraftConfig)
    return serve(config_from_args(parser.parse_args(argv), DraftConfig))
