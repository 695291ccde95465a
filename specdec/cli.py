"""The `specdec` command. Each subcommand lives in specdec/commands/<name>.py with
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches and turns errors a user
can act on into one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys

from specdec.errors import SpecdecError

LOG_LEVELS = ("debug", "info", "warning", "error")
LOG_LEVEL_ENV = "SPECDEC_LOG_LEVEL"  # what --log-level set, for the servers a command starts
COMMANDS = ("generate", "serve", "deploy", "bench", "train", "loadtest", "trace_report")  # modules under specdec.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for LLMs.")
    inherited = os.environ.get(LOG_LEVEL_ENV, "").lower()
    parser.add_argument("--log-level", choices=LOG_LEVELS, default=inherited if inherited in LOG_LEVELS else "warning",
                        help="what goes to stderr (info: choices made for you, e.g. what dtype auto picked and why)")
    subparsers = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"specdec.commands.{name}").add_parser(subparsers)
    return parser


def main(argv: list[str] | None = None) -> int:
    from specdec.launch import die_with_parent

    die_with_parent()  # a server spawn() started ends with the process that started it
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser().parse_args(argv)
    args.argv = argv  # for commands that re-launch themselves (generate --tp N)
    os.environ[LOG_LEVEL_ENV] = args.log_level  # servers and ranks this command starts log alike
    logging.basicConfig(format="%(name)s: %(message)s")  # a handler on stderr, unless one is there already
    logging.getLogger().setLevel(args.log_level.upper())
    try:
        return args.run(args)
    except SpecdecError as exc:
        if os.environ.get("RANK", "0") == "0":  # tensor-parallel ranks fail alike: one line is enough
            print(f"specdec: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
