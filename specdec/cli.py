"""The `specdec` command. Each subcommand lives in specdec/commands/<name>.py with
`add_parser(subparsers)` and `run(args) -> int`; this file only dispatches and turns errors a user
can act on into one line on stderr and exit code 2.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys

from specdec.errors import SpecdecError

COMMANDS = ("generate", "serve", "deploy", "bench", "train", "loadtest", "trace_report")  # modules under specdec.commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="specdec", description="Lossless speculative decoding for LLMs.")
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
