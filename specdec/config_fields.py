"""Configs as frozen dataclasses from outside values: a YAML mapping, command-line flags, and back.

One mapping from field names to keys and flags (field `draft_wait_s` -> key `draft_wait_s`, flag
`--draft-wait-s`), shared by every component's config, so a file, the flags and a launcher that
spawns a worker with `config_to_argv` can never disagree about a name.
"""
from __future__ import annotations

import argparse
import dataclasses

from specdec.errors import InvalidArgument

def _is_section(field: dataclasses.Field) -> bool:
    """A field that is itself a config (`security`): a mapping in YAML, its own flags on the command line."""
    return dataclasses.is_dataclass(field.default)


def build_config(cls, values, where: str):
    """The one way a config is made from outside values (a YAML mapping, parsed flags): every field a
    file or a flag names reaches the dataclass, unknown names are refused, lists become tuples,
    sections (mappings) become their own config."""
    if values is None:
        return cls()
    if not isinstance(values, dict):
        raise InvalidArgument(f"{where} must be a mapping, got {type(values).__name__}")
    fields = {f.name: f for f in dataclasses.fields(cls)}
    unknown = set(values) - set(fields)
    if unknown:
        raise InvalidArgument(f"{where}: unknown keys {', '.join(sorted(unknown))} (valid: {', '.join(sorted(fields))})")
    built = {}
    for name, value in values.items():
        if _is_section(fields[name]) and not dataclasses.is_dataclass(value):
            value = build_config(type(fields[name].default), value, f"{where}.{name}")
        built[name] = tuple(value) if isinstance(value, list) else value
    return cls(**built)


def add_config_args(parser: argparse.ArgumentParser, cls, prefix: str = "") -> None:
    """One flag per field: --draft-wait-s, --no-pipeline for booleans that default to True; a section's
    fields get flags of their own names (--tls-cert-file, --insecure), stored as `section.field`."""
    for f in dataclasses.fields(cls):
        if _is_section(f):
            add_config_args(parser, type(f.default), prefix=f"{prefix}{f.name}.")
            continue
        flag = "--" + f.name.replace("_", "-")
        dest = prefix + f.name
        if f.type in ("bool | None", "Optional[bool]"):  # unset (None: the component decides), on or off
            parser.add_argument(flag, dest=dest, action=argparse.BooleanOptionalAction, default=f.default)
        elif f.type in ("bool", bool):
            parser.add_argument(flag, dest=dest, action="store_true", default=f.default)
            parser.add_argument("--no-" + f.name.replace("_", "-"), dest=dest, action="store_false")
        elif f.name in ("targets", "drafts"):
            parser.add_argument(flag, dest=dest, action="append", default=[], metavar="HOST:PORT")
        else:
            kind = {"int": int, "float": float}.get(str(f.type), str)
            parser.add_argument(flag, dest=dest, type=kind, default=f.default)


def config_from_args(args: argparse.Namespace, cls, prefix: str = ""):
    return build_config(cls, {f.name: config_from_args(args, type(f.default), f"{prefix}{f.name}.") if _is_section(f)
                              else getattr(args, prefix + f.name) for f in dataclasses.fields(cls)}, "flags")


def config_to_argv(config) -> list[str]:
    """The flags that reproduce `config` through add_config_args (for spawning a worker)."""
    argv = []
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        name = f.name.replace("_", "-")
        if _is_section(f):
            argv += config_to_argv(value)
        elif isinstance(value, bool):
            argv.append(f"--{name}" if value else f"--no-{name}")
        elif isinstance(value, tuple):
            for item in value:
                argv += [f"--{name}", str(item)]
        elif value is not None:
            argv += [f"--{name}", str(value)]
    return argv
