"""`specdec generate`: one prompt through the in-process engine, or through a running router with --server (streamed text, or --json)."""
from __future__ import annotations

import argparse
import json
import os
import sys

from specdec.core.types import (DEFAULT_KV_CACHE, DEFAULT_LINEAR_KERNEL, KV_CACHES, LINEAR_KERNELS, SamplingParams,
                                check_linear_kernel)
from specdec.drafters import DRAFTERS


def add_sampling_args(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    parser.add_argument("--top-p", type=float, default=1.0)
    parser.add_argument("--top-k", type=int, default=0, help="0 = off")
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def sampling_params(args: argparse.Namespace) -> SamplingParams:
    return SamplingParams(temperature=args.temperature, top_p=args.top_p, top_k=args.top_k, seed=args.seed,
                          max_new_tokens=args.max_new_tokens, stop=tuple(args.stop))


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("generate", help="generate text for one prompt")
    p.add_argument("prompt", help="the prompt text")
    p.add_argument("--drafter", choices=DRAFTERS, default="ngram")
    p.add_argument("--target", default=None, help="target checkpoint dir (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--draft", default=None, help="draft model checkpoint dir (with --drafter draft)")
    p.add_argument("--num-speculative-tokens", type=int, default=None,
                   help="most draft tokens per step (default: the drafter's own; 8, suffix and ngram 16)")
    p.add_argument("--tree-width", type=int, default=1, help="branches per level (1 = a chain)")
    p.add_argument("--drafter-options", default="", metavar="JSON",
                   help='the drafter\'s options as a JSON object, e.g. \'{"mode": "choose"}\' (over --tree-width)')
    p.add_argument("--no-adaptive", action="store_true", help="always draft the maximum")
    p.add_argument("--dtype", default="auto", help="auto | float32 | bfloat16")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel degree: run the engine as N processes")
    p.add_argument("--device", default="auto",
                   help="auto (cuda when a GPU is visible, else cpu) | cpu | cuda | cuda:N; with --tp each rank "
                        "takes its own GPU")
    p.add_argument("--cuda-graphs", action=argparse.BooleanOptionalAction, default=None,
                   help="verify forwards as CUDA graphs for padded shapes (default: wherever they run, i.e. on one "
                        "CUDA device; asked for on a CPU: eager, said once)")
    p.add_argument("--kv-cache", choices=KV_CACHES, default=DEFAULT_KV_CACHE,
                   help="static: preallocated, committed by index bookkeeping; dynamic: transformers' DynamicCache")
    p.add_argument("--linear-kernel", default=DEFAULT_LINEAR_KERNEL, metavar="{%s}" % ",".join(LINEAR_KERNELS),
                   help="linear layers on specdec's row-invariant CPU kernel (specdec), torch's F.linear (torch), "
                        "or specdec's wherever it runs (auto)")
    add_sampling_args(p)
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--json", action="store_true", help="print one JSON object instead of streaming text")
    p.add_argument("--server", default=None, metavar="HOST:PORT",
                   help="call a running router (`specdec serve`) instead of loading models here; the model "
                        "and drafter flags are then the server's business")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="with --server: present what this deployment file provides (its security section's CA and "
                        "certificate, an API key from env SPECDEC_API_KEY or the router's key files)")
    p.add_argument("--timeout-s", type=float, default=None, help="deadline of the call (with --server)")
    p.add_argument("--user", default="", help="who asks, for the server's fair queueing (with --server; "
                                              "default: this connection)")
    p.set_defaults(run=run)


def drafter_options(args: argparse.Namespace) -> dict:
    from specdec.drafters import parse_options

    given = parse_options(args.drafter, args.drafter_options)
    if args.tree_width == 1:
        return given
    width = {"num_branches": args.tree_width} if args.drafter == "ngram" else {"tree_width": args.tree_width}
    return {**width, **given}


def run(args: argparse.Namespace) -> int:
    params = sampling_params(args)  # validate before loading anything
    check_linear_kernel(args.linear_kernel)
    if args.server is not None:
        from specdec.client import Client, client_options
        from specdec.serving_config import load_stack_config

        options = client_options(load_stack_config(args.config)) if args.config else {}
        with Client(args.server, **options) as client:
            return _print(args, lambda: client.stream(args.prompt, params, chat=args.chat, timeout_s=args.timeout_s,
                                                      user=args.user))
    if args.tp > 1 and "WORLD_SIZE" not in os.environ:  # the launcher: re-run this command as N ranks
        from transformers import AutoConfig

        from specdec import parallel
        from specdec.device import placement
        from specdec.models.loader import resolve_path

        # too few GPUs: refused before any rank starts
        device, _ = placement(args.device, args.dtype, args.tp, target=args.target)
        parallel.check_tp_degree(AutoConfig.from_pretrained(resolve_path(args.target), local_files_only=True), args.tp)
        return parallel.launch(args.argv, args.tp, device_name=device.type)
    from specdec.engine import Engine

    engine = Engine.from_pretrained(target=args.target, drafter=args.drafter, draft=args.draft, dtype=args.dtype,
                                    num_speculative_tokens=args.num_speculative_tokens,
                                    adaptive=not args.no_adaptive, tp=args.tp, kv_cache=args.kv_cache,
                                    device=args.device, cuda_graphs=args.cuda_graphs,
                                    linear_kernel=args.linear_kernel,
                                    **drafter_options(args))
    return _print(args, lambda: engine.stream(args.prompt, params, chat=args.chat))


def _print(args: argparse.Namespace, stream) -> int:
    """The same output in process and through a server: streamed text, or one JSON object."""
    if args.json:
        out = next(e.output for e in stream() if e.output is not None)
        print(json.dumps({"text": out.text, "token_ids": out.token_ids, "finish_reason": out.finish_reason,
                          **out.stats.to_dict()}))
        return 0
    for event in stream():
        sys.stdout.write(event.text)
        sys.stdout.flush()
        if event.output is not None and os.environ.get("RANK", "0") == "0":  # one summary per --tp group
            s = event.output.stats
            print(f"\n[{s.num_new_tokens} tokens, {s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f}, "
                  f"acceptance {s.acceptance_rate:.2f}, {event.output.finish_reason}]", file=sys.stderr)
    return 0
