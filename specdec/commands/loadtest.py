"""`specdec loadtest`: throughput and latency per concurrency level against a router (or a local stack)."""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import statistics
import sys

from specdec.commands.serve import DEFAULT_DRAFTER, DRAFT_PLACES, DRAFTERS
from specdec.errors import InvalidArgument


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("loadtest", help="load-test a router at several concurrency levels")
    p.add_argument("--server", default=None, metavar="HOST:PORT",
                   help="router gRPC address (default: start a local stack)")
    p.add_argument("--http", nargs="?", const="", default=None, metavar="URL",
                   help="send the requests to the OpenAI-compatible HTTP API instead of gRPC: at URL "
                        "(http://HOST:PORT; --server, if given, still reports the server's batch figures) "
                        "or, without URL, the local stack's")
    p.add_argument("--config", default=None, metavar="FILE",
                   help="with --server / --http URL: present what this deployment file provides (its security "
                        "section's CA, an API key from env SPECDEC_API_KEY or the router's key files)")
    p.add_argument("--concurrency", default="1,2,4,8,16", help="comma-separated levels")
    p.add_argument("--requests", type=int, default=None,
                   help="requests per level (default: 48 with --compare, else 16)")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--prompts", choices=("distinct", "repeated"), default="distinct",
                   help="distinct: no request of a run asks what another asked (eight kinds of chat request, their "
                        "slots varied); repeated: the eight fixed prompts over and over, where a drafter that "
                        "remembers earlier answers (suffix, hybrid) drafts them whole")
    p.add_argument("--drafter", default=None, metavar="{%s}[,...]" % ",".join(DRAFTERS),
                   help="drafter of the local stack (default: hybrid for the embedded target, whose Medusa heads "
                        "ship with it; %s for --target); with --compare a comma-separated list: one speculative "
                        "stack per drafter, all alternating with the no-speculation one" % DEFAULT_DRAFTER)
    p.add_argument("--drafter-options", default="", metavar="JSON",
                   help="local stack: the drafter's options as a JSON object (as `specdec serve --drafter-options`; "
                        "with several drafters, each must take them)")
    p.add_argument("--draft-in", choices=DRAFT_PLACES, default="worker",
                   help="local stack: ngram / suffix / draft in a draft worker process or inside the target worker")
    p.add_argument("--target", default=None, help="target checkpoint dir of the local stack (default: embedded)")
    p.add_argument("--dtype", default="auto", choices=("auto", "float32", "bfloat16", "float16"),
                   help="weights of the local stacks' models (bfloat16: half the bytes a token; on a CPU with AMX "
                        "a verify forward costs about a one-token one)")
    p.add_argument("--no-spec", action="store_true", help="local stack without speculation")
    p.add_argument("--compare", action="store_true", help="local stacks with and without speculation, one after the other")
    p.add_argument("--rounds", type=int, default=None,
                   help="run each level this many times (with --compare, alternating the stacks) and report the "
                        "median run: a shared machine drifts between runs (default: 3 with --compare, else 1)")
    p.add_argument("--warmup", type=int, default=None, metavar="N",
                   help="requests each stack serves, one at a time, before the first level, not counted (default: "
                        "16 for the local stacks, which start cold; 0 with --server or --http URL); their prompts are "
                        "none of the measured ones")
    p.add_argument("--plot", default=None, help="write throughput against concurrency as PNG here")
    p.add_argument("--json", action="store_true")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from specdec.core.types import SamplingParams
    from specdec.loadtest import median_run, paired_speedups, plot, run_level

    try:
        levels = [int(c) for c in args.concurrency.split(",")]
    except ValueError:
        raise InvalidArgument(f"--concurrency must be comma-separated integers, got {args.concurrency!r}") from None
    # A comparison's defaults: a round of 16 requests holds two of each of the eight kinds of prompt, so its ratio
    # moves with the sample (one user 1.36-1.60 in one run) by as much as speculation gains under load; and one
    # round's ratio moves with the machine (README, "Load test").
    if args.rounds is None:
        args.rounds = COMPARE_ROUNDS if args.compare else 1
    if args.requests is None:
        args.requests = COMPARE_REQUESTS if args.compare else 16
    if not levels or min(levels) < 1 or args.requests < 1 or args.rounds < 1:
        raise InvalidArgument("--concurrency levels, --requests and --rounds must be >= 1")
    if args.warmup is not None and args.warmup < 0:
        raise InvalidArgument(f"--warmup must be >= 0, got {args.warmup}")
    remote = bool(args.server or args.http)  # a server given: its own drafter, already warm, not started here
    if remote and args.compare:
        raise InvalidArgument("--compare starts its own stacks; it cannot be used with --server or --http URL")
    if args.server and args.http == "":
        raise InvalidArgument("with --server, give the HTTP API's address: --http http://HOST:PORT")
    if args.http:
        from specdec.loadtest_http import split_url

        split_url(args.http)  # a malformed URL fails here, not once per request
    options = {}
    if args.config:
        from specdec.client import client_options
        from specdec.serving_config import load_stack_config

        options = client_options(load_stack_config(args.config))
    drafters = drafter_list(args.drafter or default_drafter(args.target), args.compare)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    configs = [("no speculation" if args.no_spec else "server" if remote else drafters[0],
                None if args.no_spec else drafters[0])]
    if args.compare:  # one speculative stack per drafter, then the plain one
        configs = [("speculative" if len(drafters) == 1 else f"speculative ({d})", d) for d in drafters]
        configs.append(("no speculation", None))
    labels = [label + (" over HTTP" if args.http is not None else "") for label, _ in configs]
    if not remote:  # local stacks: the figures depend on this machine
        from specdec.bench.machine import machine_info
        from specdec.device import placement

        machine = machine_info()
        dtype = args.dtype if args.dtype != "auto" else (  # what the targets' own placement will pick
            f"auto = {str(placement('auto', 'auto', target=args.target)[1]).removeprefix('torch.')}")
        print(f"local stacks on {machine['cpu']} (flags: {' '.join(machine['cpu_flags']) or 'none'}), "
              f"{machine['num_cpus']} CPUs, torch {machine['torch_num_threads']} threads, dtype {dtype}, "
              f"drafter {'none' if args.no_spec else ','.join(drafters)}, "
              f"prompts {args.prompts}, load {machine.get('load_average_1m')}", file=sys.stderr, flush=True)
    with contextlib.ExitStack() as stacks:  # every stack up at once: levels alternate between them
        targets = [stacks.enter_context(_stack(args, drafter)) for _, drafter in configs]
        runs = {label: [] for label in labels}
        first_index = {label: 0 for label in labels}
        warmup = args.warmup if args.warmup is not None else (0 if remote else WARMUP_REQUESTS)
        # A cold stack's first requests pay what a running server has long paid: the thread team's first forward
        # of each size, the speculation policy's first cost measurements, and a drafter that learns from answers
        # (suffix decoding, the hybrid) drafting from none: in process the hybrid's first 16 of the load test's
        # requests ran tau 1.5-1.8 against ~2.0 after (README, "Load test"). Distinct prompts after every measured
        # one, so none is measured twice.
        if warmup:
            for address, http_url in targets:
                run_level(address, 1, warmup, params, http_url=http_url, client_options=options,
                          first_index=args.rounds * len(levels) * args.requests, repeated=args.prompts == "repeated")
        for c in levels:
            tries = {label: [] for label in labels}
            for r in range(args.rounds):  # rotate the order, so drift of a shared machine hits every side
                order = list(zip(labels, targets))
                for label, (address, http_url) in order[r % len(order):] + order[:r % len(order)]:
                    tries[label].append(run_level(address, c, args.requests, params, http_url=http_url,
                                                  client_options=options, first_index=first_index[label],
                                                  repeated=args.prompts == "repeated"))
                    first_index[label] += args.requests  # every stack gets the same prompts, none twice
            for label in labels:
                result = median_run(tries[label])
                plain = tries[labels[-1]]
                ratios = paired_speedups(tries[label], plain) if args.compare and label != labels[-1] else []
                if ratios:
                    result = dataclasses.replace(result, paired_speedup=statistics.median(ratios))
                runs[label].append(result)
                print(f"[{label}] concurrency {result.concurrency}: {result.output_tokens_per_s:.1f} tok/s, "
                      f"ttft p50 {result.ttft_p50_s:.2f}s p99 {result.ttft_p99_s:.2f}s, tpot p50 "
                      f"{result.tpot_p50_s * 1000:.0f}ms p99 {result.tpot_p99_s * 1000:.0f}ms, acceptance "
                      f"{result.acceptance_rate:.2f}, server batch {result.mean_batch_size:.2f}, "
                      f"errors {result.num_errors}", file=sys.stderr, flush=True)
                if ratios:
                    print(f"[{label}] concurrency {c}: {result.paired_speedup:.2f}x {labels[-1]} (median over "
                          f"rounds, each on the same prompts: {', '.join(f'{r:.2f}' for r in ratios)})",
                          file=sys.stderr, flush=True)
    if args.plot:
        plot(runs, args.plot)
    if args.json:
        print(json.dumps({label: [r.to_dict() for r in levels_] for label, levels_ in runs.items()}))
    return 0


WARMUP_REQUESTS = 16  # per local stack, before the first level (--warmup)
COMPARE_ROUNDS = 3  # --compare's rounds unless --rounds says otherwise
COMPARE_REQUESTS = 48  # --compare's requests per level unless --requests says otherwise


def default_drafter(target: str | None) -> str:
    """The local stack's drafter when --drafter names none: what a user of this target would pick. For the
    embedded target that is the hybrid (suffix decoding + the Medusa heads shipped with it), the fastest
    drafter measured at every load level; prompt lookup in a draft worker (serve's default) drafts nothing on
    most chat prompts and, on two cores, its draft worker's own work for each request and step competes with
    the target's forward (README, "Load test"). A target of your own has no shipped heads: serve's default."""
    return "hybrid" if target is None else DEFAULT_DRAFTER


def drafter_list(text: str, compare: bool) -> list[str]:
    """--drafter's names: one, or with --compare several (comma-separated), each a drafter the stack offers."""
    names = [name.strip() for name in text.split(",")]
    if any(name not in DRAFTERS for name in names) or len(set(names)) < len(names):
        raise InvalidArgument(f"--drafter must be distinct names among {', '.join(DRAFTERS)}, got {text!r}")
    if len(names) > 1 and not compare:
        raise InvalidArgument("several drafters need --compare (one stack each, alternating)")
    return names


def local_stack_config(args: argparse.Namespace, drafter: str | None):
    """The local stack `specdec serve` would start with its defaults and this drafter (None: the same
    target, no drafter)."""
    from specdec.commands.serve import stack_config
    from specdec.serving_config import StackConfig, TargetConfig

    no_spec = drafter is None
    ns = argparse.Namespace(config=None, target=args.target, drafter=drafter or DEFAULT_DRAFTER, draft=None,
                            drafter_options=args.drafter_options if drafter else "",
                            draft_in=args.draft_in, dtype=args.dtype, port=0,
                            http_port=0, api_keys_file=None, no_pipeline=False, metrics_port=-1, host=None,
                            insecure=False, device="auto", linear_kernel="auto")
    config = stack_config(ns)
    if no_spec:  # the same target worker, with no drafter anywhere
        config = StackConfig(router=config.router, targets=(TargetConfig(model=args.target, dtype=args.dtype),),
                             drafts=())
    return config


class _stack:
    """(gRPC address, HTTP URL or None): as given (--server, --http URL), or a local stack started (and
    stopped) here."""

    def __init__(self, args: argparse.Namespace, drafter: str | None):
        self.args, self.drafter, self.stack = args, drafter, None

    def __enter__(self) -> tuple[str | None, str | None]:
        if self.args.server or self.args.http:
            return self.args.server, self.args.http
        from specdec.launch import start_stack

        self.stack = start_stack(local_stack_config(self.args, self.drafter))
        return self.stack.address, f"http://{self.stack.http_address}" if self.args.http is not None else None

    def __exit__(self, *exc) -> None:
        if self.stack is not None:
            self.stack.stop()
