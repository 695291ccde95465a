"""`specdec serve`: the whole local stack (router + draft worker + target worker as separate
processes on 127.0.0.1), a YAML deployment (`--config FILE`), or one piece (`serve router|draft|target`)."""
from __future__ import annotations

import argparse
import dataclasses
import importlib
import signal
import sys
import threading

from specdec.core.types import DEFAULT_LINEAR_KERNEL, LINEAR_KERNELS
from specdec.config_fields import add_config_args, config_from_args
from specdec.drafters import SELF_DRAFTERS  # read the target's features: they run inside the target worker
from specdec.serving_config import DraftConfig, RouterConfig, StackConfig, TargetConfig, load_stack_config

DRAFTERS = ("ngram", "suffix", "draft") + SELF_DRAFTERS
DEFAULT_DRAFTER = "ngram"  # the local stack's drafter unless --drafter says otherwise
DRAFT_PLACES = ("worker", "target")  # where a drafter that could run in either place runs (--draft-in)
PIECES = {"router": (RouterConfig, "router.server"), "draft": (DraftConfig, "draft_service.server"),
          "target": (TargetConfig, "target_service.server")}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve over gRPC: the local stack, a YAML deployment, or one piece")
    p.add_argument("--config", default=None, help="YAML deployment file (router, targets, drafts)")
    p.add_argument("--target", default=None, help="target checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", choices=DRAFTERS, default=DEFAULT_DRAFTER,
                   help="ngram / suffix / draft run in a draft worker; medusa / eagle heads and hybrid (suffix + medusa) "
                        "run inside the target worker")
    p.add_argument("--draft", default=None, help="trained drafter checkpoint dir (draft, medusa, eagle, eagle3; hybrid: medusa's)")
    p.add_argument("--drafter-options", default="", metavar="JSON",
                   help='the drafter\'s options as a JSON object, e.g. \'{"mode": "choose"}\' for hybrid or '
                        '\'{"num_nodes": 24}\' for suffix (the names Engine.from_pretrained takes)')
    p.add_argument("--draft-in", choices=DRAFT_PLACES, default="worker",
                   help="where ngram / suffix / draft run: a draft worker process (default) or inside the target "
                        "worker (no draft round trip per step; the heads always run there)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--device", default="auto",
                   help="target and draft worker's device: auto (cuda when a GPU is visible, else cpu) | cpu | cuda | "
                        "cuda:N (for per-worker devices use --config or `serve target|draft --device`)")
    p.add_argument("--linear-kernel", default=DEFAULT_LINEAR_KERNEL, metavar="{%s}" % ",".join(LINEAR_KERNELS),
                   help="target and draft model's linear layers: specdec's row-invariant CPU kernel (specdec), "
                        "torch's F.linear (torch), or specdec's wherever it runs (auto)")
    p.add_argument("--port", type=int, default=0, help="router gRPC port (0 = any free port)")
    p.add_argument("--http-port", type=int, default=0,
                   help="router's OpenAI-compatible HTTP API port (0 = any free port, -1 = none)")
    p.add_argument("--api-keys-file", default=None,
                   help="API keys, one per line, required by both APIs (also env SPECDEC_API_KEYS)")
    p.add_argument("--host", default=None,
                   help="address every server binds (default 127.0.0.1; 0.0.0.0 = every interface); with --config, "
                        "replaces each component's host")
    p.add_argument("--insecure", action="store_true",
                   help="ignore the config's security section: plaintext, every peer trusted (said at start when "
                        "binding beyond loopback)")
    p.add_argument("--no-pipeline", action="store_true", help="draft worker waits for each verify result")
    p.add_argument("--metrics-port", type=int, default=-1,
                   help="router's Prometheus endpoint (GET /metrics) on this port, each worker's on a free port, "
                        "all printed on the ready line (-1 = none, the default; 0 = any free port)")
    p.add_argument("--demo", action="store_true",
                   help="once ready, decode one sample request through the stack plainly and speculatively, side by side")
    p.set_defaults(run=run_stack)
    pieces = p.add_subparsers(dest="piece", required=False, metavar="{router,draft,target}")
    for name, (cls, module) in PIECES.items():
        sp = pieces.add_parser(name, help=f"start one {name} process")
        add_config_args(sp, cls)
        sp.set_defaults(run=lambda args, cls=cls, module=module: importlib.import_module(module).serve(
            config_from_args(args, cls)))


def stack_config(args: argparse.Namespace) -> StackConfig:
    return _with_host_and_security(_stack_config(args), args.host, args.insecure)


def _with_host_and_security(config: StackConfig, host: str | None, insecure: bool) -> StackConfig:
    """--host and --insecure applied to every component (and to what the stack's own clients present)."""
    def fix(component):
        changes = {"host": host} if host is not None else {}
        if insecure:
            changes["security"] = dataclasses.replace(component.security, insecure=True)
        return dataclasses.replace(component, **changes)

    return dataclasses.replace(config, router=fix(config.router), targets=tuple(map(fix, config.targets)),
                               drafts=tuple(map(fix, config.drafts)),
                               security=dataclasses.replace(config.security, insecure=True) if insecure
                               else config.security)


def _stack_config(args: argparse.Namespace) -> StackConfig:
    if args.config is not None:
        return load_stack_config(args.config)
    router = RouterConfig(port=args.port, http_port=args.http_port, api_keys_file=args.api_keys_file,
                          metrics_port=args.metrics_port)
    workers = -1 if args.metrics_port < 0 else 0  # with the router's endpoint, one per worker on a free port
    if args.drafter in SELF_DRAFTERS or args.draft_in == "target":
        return StackConfig(router=router, drafts=(),
                           targets=(TargetConfig(model=args.target, dtype=args.dtype, drafter=args.drafter,
                                                 draft=args.draft, drafter_options=args.drafter_options,
                                                 metrics_port=workers, device=args.device,
                                                 linear_kernel=args.linear_kernel),))
    return StackConfig(router=router,
                       targets=(TargetConfig(model=args.target, dtype=args.dtype, metrics_port=workers,
                                             device=args.device, linear_kernel=args.linear_kernel),),
                       drafts=(DraftConfig(drafter=args.drafter, model=args.draft, target_model=args.target,
                                           drafter_options=args.drafter_options, dtype=args.dtype, pipeline=not args.no_pipeline, metrics_port=workers,
                                           device=args.device, linear_kernel=args.linear_kernel),))


def run_stack(args: argparse.Namespace) -> int:
    from specdec.launch import start_stack
    from specdec.rpc.server import wait_for_signal

    config = stack_config(args)
    check_devices(config)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stack = start_stack(config, echo=lambda line: sys.stderr.write(line), supervise=True)  # restarts what dies
    try:
        print(f"specdec stack ready: router on {stack.address} "
              f"(targets {', '.join(p.address for p in stack.targets)}; "
              f"drafts {', '.join(p.address for p in stack.drafts) or 'none'})"
              + (f"; OpenAI-compatible HTTP API on http://{stack.http_address}/v1" if stack.http_address else "")
              + metrics_detail(stack), flush=True)
        if args.demo:  # the same request plainly and speculatively, side by side (specdec/demo.py)
            from specdec.demo import served

            served(stack, demo_drafter(config), config)
            print(f"\nThe stack keeps serving on {stack.address}; try `specdec generate --server {stack.address} "
                  f"...`", flush=True)
            if stack.http_address:
                print(f"or the OpenAI-compatible API: curl http://{stack.http_address}/v1/chat/completions "
                      """-H 'Content-Type: application/json' -d '{"messages": [{"role": "user", "content": "Hi!"}]}'""",
                      flush=True)
            print("Ctrl-C stops it.", flush=True)
        wait_for_signal(stop)
    finally:
        stack.stop()
    return 0


def check_devices(config: StackConfig) -> None:
    """A GPU asked for where none is (or too few for a target's --tp): one line here, before any
    worker starts, rather than a worker dying during start-up."""
    workers = [(t.device, t.tp) for t in config.targets] + [(d.device, 1) for d in config.drafts if d.drafter == "draft"]
    if any(device.startswith("cuda") for device, _ in workers):
        from specdec.device import resolve_device

        for device, tp in workers:
            resolve_device(device, tp)


def demo_drafter(config: StackConfig) -> str:
    """The drafter the stack speculates with, for the demo's label."""
    if config.drafts:
        return config.drafts[0].drafter
    return config.targets[0].drafter if config.targets else "none"


def metrics_detail(stack) -> str:
    """'; Prometheus metrics: router http://.../metrics, target ..., draft ...' ('' when none serves any)."""
    served = [(p.kind, p.metrics_address) for p in (stack.router, *stack.targets, *stack.drafts) if p.metrics_address]
    if not served:
        return ""
    return "; Prometheus metrics: " + ", ".join(f"{kind} http://{address}/metrics" for kind, address in served)
