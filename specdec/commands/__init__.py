"""Subcommands of the `specdec` CLI, one module each (see specdec/cli.py)."""
