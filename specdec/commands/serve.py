"""`specdec serve`: the whole local stack (router + draft worker + target worker as separate
processes on 127.0.0.1), a YAML deployment (`--config FILE`), or one piece (`serve router|draft|target`)."""
from __future__ import annotations

import argparse
import importlib
import signal
import sys
import threading

from specdec.serving_config import (DraftConfig, RouterConfig, StackConfig, TargetConfig, add_config_args,
                                    config_from_args, load_stack_config)

SELF_DRAFTERS = ("medusa", "eagle")  # read the target's features: they run inside the target worker
PIECES = {"router": (RouterConfig, "router.server"), "draft": (DraftConfig, "draft_service.server"),
          "target": (TargetConfig, "target_service.server")}


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="serve over gRPC: the local stack, a YAML deployment, or one piece")
    p.add_argument("--config", default=None, help="YAML deployment file (router, targets, drafts)")
    p.add_argument("--target", default=None, help="target checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--drafter", choices=("ngram", "suffix", "draft") + SELF_DRAFTERS, default="ngram",
                   help="ngram / suffix / draft run in a draft worker; medusa / eagle heads run inside the target worker")
    p.add_argument("--draft", default=None, help="trained drafter checkpoint dir (draft, medusa, eagle)")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--port", type=int, default=0, help="router port (0 = any free port)")
    p.add_argument("--no-pipeline", action="store_true", help="draft worker waits for each verify result")
    p.add_argument("--demo", action="store_true", help="once ready, stream one sample request through the stack")
    p.set_defaults(run=run_stack)
    pieces = p.add_subparsers(dest="piece", required=False, metavar="{router,draft,target}")
    for name, (cls, module) in PIECES.items():
        sp = pieces.add_parser(name, help=f"start one {name} process")
        add_config_args(sp, cls)
        sp.set_defaults(run=lambda args, cls=cls, module=module: importlib.import_module(module).serve(
            config_from_args(args, cls)))


def stack_config(args: argparse.Namespace) -> StackConfig:
    if args.config is not None:
        return load_stack_config(args.config)
    if args.drafter in SELF_DRAFTERS:
        return StackConfig(router=RouterConfig(port=args.port), drafts=(),
                           targets=(TargetConfig(model=args.target, dtype=args.dtype, drafter=args.drafter,
                                                 draft=args.draft),))
    return StackConfig(router=RouterConfig(port=args.port),
                       targets=(TargetConfig(model=args.target, dtype=args.dtype),),
                       drafts=(DraftConfig(drafter=args.drafter, model=args.draft, target_model=args.target,
                                           dtype=args.dtype, pipeline=not args.no_pipeline),))


def run_stack(args: argparse.Namespace) -> int:
    from specdec.launch import start_stack

    config = stack_config(args)
    stop = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stop.set())
    stack = start_stack(config, echo=lambda line: sys.stderr.write(line))
    try:
        print(f"specdec stack ready: router on {stack.address} "
              f"(targets {', '.join(p.address for p in stack.targets)}; "
              f"drafts {', '.join(p.address for p in stack.drafts) or 'none'})", flush=True)
        if args.demo:
            demo(stack.address)
        stop.wait()
    finally:
        stack.stop()
    return 0


DEMO_PROMPT = "Write a short JSON object describing a cat named Tom, then repeat it with the age changed."


def demo(address: str) -> None:
    """What `make run` shows: a request streaming through router -> draft worker -> target worker."""
    from specdec.client import Client
    from specdec.core.types import SamplingParams

    print(f"\n$ specdec generate --server {address} --chat {DEMO_PROMPT!r}\n", flush=True)
    with Client(address) as client:
        for chunk in client.stream(DEMO_PROMPT, SamplingParams(max_new_tokens=96), chat=True, timeout_s=300):
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
            if chunk.output is not None:
                s = chunk.output.stats
                print(f"\n[{s.num_new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f}, "
                      f"acceptance {s.acceptance_rate:.2f}, {chunk.output.finish_reason}]")
    print(f"\nThe stack keeps serving on {address}; try `specdec generate --server {address} ...`. Ctrl-C stops it.",
          flush=True)
