"""Configs of the serving processes, one frozen dataclass per component, and the YAML deployment file.

Each process gets only its own config. The same dataclasses define the command-line flags of
`specdec serve router|draft|target` (field `draft_wait_s` -> `--draft-wait-s`), so a YAML file, the
flags and the launcher that spawns workers can never disagree about a name.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from pathlib import Path

from specdec.config_fields import build_config
from specdec.core.types import (DEFAULT_KV_CACHE, DEFAULT_LINEAR_KERNEL, DEFAULT_PREFIX_CACHE_MB, check_device_name,
                                check_kv_cache, check_linear_kernel)
from specdec.drafters import parse_options
from specdec.errors import InvalidArgument
from specdec.security_config import LOOPBACK, SecurityConfig


def _normalize_drafter_options(config) -> None:
    """A config's drafter_options checked against its drafter and kept as canonical JSON text (a YAML mapping
    or a flag's JSON both end up the same string, which config_to_argv passes on unchanged)."""
    options = parse_options(config.drafter, config.drafter_options)
    object.__setattr__(config, "drafter_options", json.dumps(options, sort_keys=True) if options else "")


@dataclass(frozen=True)
class TargetConfig:
    model: str | None = None  # checkpoint dir; None = the embedded SmolLM2-135M-Instruct
    dtype: str = "auto"
    port: int = 0  # 0 = any free port (printed on the ready line)
    # How long a step waits for a live drafter's draft before decoding alone. Generous: the drafter's
    # own controller decides when drafting does not pay (it then sends an empty draft at once), and a
    # dead drafter is noticed at once through its stream; this only bounds a hung one.
    draft_wait_s: float = 2.0
    max_missed_drafts: int = 2  # after this many waits in a row without a draft, stop waiting
    max_tree_nodes: int = 64
    max_sequences: int = 64  # admitted at once; beyond: RESOURCE_EXHAUSTED at once
    max_draft_links: int = 16  # draft workers' Verify streams at once; beyond: RESOURCE_EXHAUSTED
    max_batch: int = 8  # ready sequences verified together in one forward (1 = one at a time)
    # Once one sequence is ready, wait up to this long for the other sequences' drafts, so the sequences
    # of a step stay in one batch (their drafts arrive milliseconds apart). 0 = step whatever is ready.
    batch_wait_s: float = 0.02
    # KV cache budget in tokens: each admitted sequence reserves prompt + max_new_tokens of it for its
    # life, so a full cache refuses admission (RESOURCE_EXHAUSTED) instead of failing mid-generation.
    # 0 = max_sequences x the model's context (room for every slot at full length).
    max_kv_tokens: int = 0
    # A prompt is prefilled this many tokens at a time, one chunk between decode steps, so running
    # streams slow down by a chunk's forward per step instead of waiting for a whole long prompt.
    prefill_chunk_tokens: int = 256
    num_threads: int = 0  # torch intra-op threads; 0 = torch's default
    # Tensor-parallel degree: the worker runs as this many processes that split the model (rank 0
    # serves gRPC, the others follow it); it must divide the attention and key-value head counts.
    tp: int = 1
    # Drafting inside the target (sequences then need no draft worker): none | ngram | draft | medusa |
    # eagle | eagle3. Medusa and EAGLE heads read the target's features, so they can only run here.
    drafter: str = "none"
    draft: str | None = None  # trained checkpoint dir of that drafter (None = the shipped one: embedded target only)
    # That drafter's options, as Engine.from_pretrained takes them (e.g. {"mode": "choose"} for hybrid): a mapping
    # in YAML, a JSON object on the command line; kept as its JSON text (a frozen config stays hashable).
    drafter_options: str = ""
    num_speculative_tokens: int = 8
    adaptive: bool = True
    # Trim every batch's drafts to the depth that measured costs and acceptance say pays at this batch
    # size (specdec.policy), and tell drafters how much to draft: speculation never slows a loaded server.
    load_aware: bool = True
    metrics_port: int = -1  # Prometheus endpoint on `host` (GET /metrics): -1 = none, 0 = any free port
    host: str = LOOPBACK  # the address the servers bind (0.0.0.0 = every interface)
    advertise_host: str | None = None  # the host others dial (the ready line's); None = host (a wildcard: this machine's name)
    drain_timeout_s: float = 30.0  # on SIGTERM: admit nothing new, let running sequences finish this long, then exit
    security: SecurityConfig = SecurityConfig()  # who may call (specdec/security_config.py)
    kv_cache: str = DEFAULT_KV_CACHE  # static (preallocated) | dynamic (transformers' DynamicCache)
    # auto (cuda when a GPU is visible, else cpu) | cpu | cuda | cuda:N; with tp each rank takes its own GPU
    device: str = "auto"
    # On a GPU: the share of the GPU's memory this worker may fill (weights, activations, KV cache); the
    # KV budget is what is left of it after loading (vLLM's gpu_memory_utilization). max_kv_tokens > 0
    # overrides it; on a CPU the budget stays max_kv_tokens or max_sequences x the model's context.
    gpu_memory_fraction: float = 0.9
    # verify forwards as CUDA graphs for padded shapes: None = wherever they run (one CUDA device, a static
    # cache), True = asked for (eager on a CPU or under tp, said once), False = eager
    cuda_graphs: bool | None = None
    linear_kernel: str = DEFAULT_LINEAR_KERNEL  # auto | specdec (row-invariant CPU kernel) | torch (F.linear)
    # MiB of prompt openings' keys and values kept across requests (a shared system prompt or resent
    # turns are prefilled once); 0 = off. Not under tp > 1 nor with a dynamic KV cache.
    prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB

    def __post_init__(self) -> None:
        check_kv_cache(self.kv_cache)
        check_linear_kernel(self.linear_kernel)
        check_device_name(self.device)
        _normalize_drafter_options(self)
        if not 0.0 < self.gpu_memory_fraction <= 1.0:
            raise InvalidArgument(f"gpu_memory_fraction must be in (0, 1], got {self.gpu_memory_fraction}")
        if (self.draft_wait_s < 0 or self.drain_timeout_s < 0 or self.batch_wait_s < 0 or self.max_missed_drafts < 0 or self.max_tree_nodes < 1
                or self.max_sequences < 1 or self.max_draft_links < 1 or self.prefill_chunk_tokens < 1
                or self.max_batch < 1 or self.max_kv_tokens < 0 or self.tp < 1 or self.metrics_port < -1
                or self.prefix_cache_mb < 0):
            raise InvalidArgument(f"invalid target config {self}")


@dataclass(frozen=True)
class DraftConfig:
    drafter: str = "ngram"  # ngram | suffix | draft
    # Draft checkpoint dir (drafter draft). None = the one shipped for the embedded target (refused for
    # any other target); "random" = an untrained stand-in, for tests only.
    model: str | None = None
    target_model: str | None = None  # the target's dir, to check the vocabulary (None = embedded)
    dtype: str = "auto"
    port: int = 0
    num_speculative_tokens: int = 8
    adaptive: bool = True
    pipeline: bool = True  # draft step n+1 while the target verifies step n
    pipeline_min_hit: float = 0.3  # ... when the estimated chance that step n is accepted whole is at least this
    tree_width: int = 1  # branches per level (1 = chain)
    q_top_n: int = 32  # sampling: draw from the top-N renormalised q and send only those N entries
    num_threads: int = 0
    metrics_port: int = -1  # Prometheus endpoint on `host` (GET /metrics): -1 = none, 0 = any free port
    host: str = LOOPBACK
    advertise_host: str | None = None
    drain_timeout_s: float = 30.0  # on SIGTERM: attach nothing new, draft for attached sequences this long at most
    security: SecurityConfig = SecurityConfig()
    kv_cache: str = DEFAULT_KV_CACHE  # the draft model's KV cache: static | dynamic
    device: str = "auto"  # the draft model's device: auto | cpu | cuda | cuda:N (its own GPU, if it has one)
    linear_kernel: str = DEFAULT_LINEAR_KERNEL  # the draft model's linear layers: auto | specdec | torch
    drafter_options: str = ""  # as TargetConfig's: the drafter's options (over the fields above where both name one)

    def __post_init__(self) -> None:
        check_kv_cache(self.kv_cache)
        check_linear_kernel(self.linear_kernel)
        check_device_name(self.device)
        if self.drafter not in ("ngram", "suffix", "draft"):
            raise InvalidArgument(f"drafter must be ngram, suffix or draft, got {self.drafter!r}")
        _normalize_drafter_options(self)
        if (self.num_speculative_tokens < 1 or self.drain_timeout_s < 0 or self.tree_width < 1 or self.q_top_n < 0
                or not 0.0 <= self.pipeline_min_hit <= 1.0 or self.metrics_port < -1):
            raise InvalidArgument(f"invalid draft config {self}")


@dataclass(frozen=True)
class RouterConfig:
    port: int = 0
    targets: tuple[str, ...] = ()  # host:port of target workers
    drafts: tuple[str, ...] = ()  # host:port of draft workers (none = targets decode alone)
    tokenizer: str | None = None  # dir with tokenizer.json; None = the first target's model dir
    max_active: int = 8  # generations running at once
    max_queue: int = 32  # generations waiting; beyond: RESOURCE_EXHAUSTED
    worker_timeout_s: float = 10.0  # unary calls to workers (admission waits for prefill)
    # Fairness between users (GenerateRequest.user; anonymous = per connection): waiting requests are
    # served user by user, fewest running first. These caps bound one user's share; 0 = no cap of its own.
    max_active_per_user: int = 0
    max_queued_per_user: int = 0
    # The OpenAI-compatible HTTP API next to gRPC (same queue and batches): 0 = any free port (printed on the
    # ready line), -1 = none.
    http_port: int = 0
    # API keys, one per line, that both the HTTP API and the gRPC Generation service then require (also
    # env SPECDEC_API_KEYS, comma-separated); none configured = no check.
    api_keys_file: str | None = None
    # Admin keys (also env SPECDEC_ADMIN_KEYS): GetServerInfo shows worker addresses, sequence ids and users
    # only to them (to anyone while no key and no security section is configured). They are API keys too.
    admin_keys_file: str | None = None
    # Bounds on one request (router.limits): a text prompt's UTF-8 bytes (0 = derived from the model's
    # context and its longest token: never refuses a prompt that fits), stop strings, chat messages.
    max_prompt_bytes: int = 0
    max_stop_strings: int = 16
    max_stop_bytes: int = 256
    max_messages: int = 512
    tokenize_threads: int = 2  # long prompts are tokenized on this many threads at once (router.tokenize_pool)
    metrics_port: int = -1  # Prometheus endpoint on `host` (GET /metrics): -1 = none, 0 = any free port
    # Worker discovery (router.discovery): a YAML file {targets: [...], drafts: [...]} re-read every
    # discovery_interval_s (the Ray deployment keeps it current), and entries dns:NAME:PORT in targets /
    # drafts, re-resolved as often: workers that appear are used, workers that vanish get no more work.
    workers_file: str | None = None
    discovery_interval_s: float = 2.0
    host: str = LOOPBACK  # gRPC, HTTP API and metrics bind here
    advertise_host: str | None = None
    drain_timeout_s: float = 30.0  # on SIGTERM: take no new request, let running and queued ones finish this long
    security: SecurityConfig = SecurityConfig()

    def __post_init__(self) -> None:
        if (self.max_active < 1 or self.drain_timeout_s < 0 or self.max_queue < 0 or self.worker_timeout_s <= 0 or self.max_active_per_user < 0
                or self.max_queued_per_user < 0 or self.http_port < -1 or self.max_prompt_bytes < 0
                or self.max_stop_strings < 0 or self.max_stop_bytes < 1 or self.max_messages < 1
                or self.tokenize_threads < 1 or self.metrics_port < -1 or self.discovery_interval_s <= 0):
            raise InvalidArgument(f"invalid router config {self}")


@dataclass(frozen=True)
class StackConfig:
    """A deployment: one router plus workers (what `specdec serve --config FILE` starts)."""

    router: RouterConfig = RouterConfig()
    targets: tuple[TargetConfig, ...] = (TargetConfig(),)
    drafts: tuple[DraftConfig, ...] = (DraftConfig(),)
    ready_timeout_s: float = 300.0
    # `make deploy`'s section (specdec.deploy.config.DeployConfig): placement, restarts, images; None =
    # its defaults. `specdec serve` ignores it.
    deploy: object = None
    # The file's top-level `security` section: every component's unless it has its own `security` keys
    # (which replace those of this section, key by key); also what clients of this stack present.
    security: SecurityConfig = SecurityConfig()


def with_workers(router: RouterConfig, targets: tuple[str, ...], drafts: tuple[str, ...]) -> RouterConfig:
    """`router` with the addresses of the workers just started put first; every other field as configured."""
    return dataclasses.replace(router, targets=tuple(targets) + router.targets, drafts=tuple(drafts) + router.drafts)


def _many(cls, data, where: str, security: dict) -> tuple:
    items = data if isinstance(data, list) else [data]
    return tuple(build_config(cls, _with_security(item, security, f"{where}[{i}]"), f"{where}[{i}]")
                 for i, item in enumerate(items))


def _with_security(item, security: dict, where: str):
    """A component's mapping with the file's security section under its own `security` keys."""
    if not security or not isinstance(item, (dict, type(None))):
        return item
    own = (item or {}).get("security") or {}
    if not isinstance(own, dict):
        raise InvalidArgument(f"{where}.security must be a mapping, got {type(own).__name__}")
    return {**(item or {}), "security": {**security, **own}}


def load_stack_config(path: str | Path) -> StackConfig:
    """Read a YAML deployment: keys router, targets (or target), drafts (or draft), ready_timeout_s, deploy."""
    import yaml

    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidArgument(f"cannot read config {str(path)!r}: {exc}") from exc
    if not isinstance(data, dict):
        raise InvalidArgument(f"{path}: a deployment must be a mapping (router, targets, drafts), "
                              f"got {type(data).__name__}")
    unknown = set(data) - {"router", "targets", "target", "drafts", "draft", "ready_timeout_s", "deploy", "security"}
    if unknown:
        raise InvalidArgument(f"{path}: unknown keys {', '.join(sorted(unknown))}")
    security = data.get("security") or {}
    if not isinstance(security, dict):
        raise InvalidArgument(f"{path}: security must be a mapping, got {type(security).__name__}")
    targets = data.get("targets", data.get("target"))  # absent or null: one with the defaults
    drafts = data.get("drafts", data.get("draft"))
    return StackConfig(router=build_config(RouterConfig, _with_security(data.get("router"), security, "router"),
                                           "router"),
                       targets=_many(TargetConfig, [None] if targets is None else targets, "targets", security),
                       drafts=_many(DraftConfig, [None] if drafts is None else drafts, "drafts", security),
                       ready_timeout_s=float(data.get("ready_timeout_s", 300.0)),
                       deploy=_deploy_section(data.get("deploy")),
                       security=build_config(SecurityConfig, security, "security"))


def _deploy_section(values):
    from specdec.deploy.config import DeployConfig, build_nested

    return build_nested(DeployConfig, values, "deploy")
