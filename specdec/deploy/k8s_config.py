"""The deployment file as the pods read it: the same file, with what a cluster changes.

- Fixed ports (deploy.k8s.*_port): port 0 cannot be probed or put behind a Service.
- Servers bind every interface where the config has a `host` key (the kubelet's probes and the other
  pods must reach them); each advertises its pod's address (specdec.deploy.actors.placed_on_node).
- Files with secrets (the router's `api_keys_file` / `admin_keys_file`, and every `*_file` of a
  `security` section: certificates, keys, CAs, the internal token) travel as a Secret mounted at
  SECRETS_DIR, and the config names them there. The secrets servers read from the environment
  (SPECDEC_API_KEYS, SPECDEC_ADMIN_KEYS, SPECDEC_INTERNAL_TOKEN) come into every container from a second
  Secret, filled from the environment of the machine that renders (never written into the repository:
  the rendered Secret files are git-ignored).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from specdec.deploy.config import DeployConfig
from specdec.security_config import ADMIN_KEYS_ENV, API_KEYS_ENV, TOKEN_ENV, SecurityConfig
from specdec.serving_config import StackConfig

CONFIG_DIR = "/etc/specdec"
SECRETS_DIR = "/etc/specdec/secrets"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
ENV_SECRETS = (API_KEYS_ENV, ADMIN_KEYS_ENV, TOKEN_ENV)  # read by the servers when set


def _has(config, name: str) -> bool:
    return name in {f.name for f in dataclasses.fields(config)}


def _bind_all(config, port: int):
    changes = {"port": port}
    if _has(config, "host"):
        changes["host"] = "0.0.0.0"
    return dataclasses.replace(config, **changes)


def binds_beyond_loopback(stack: StackConfig) -> bool:
    """Whether this version's configs can bind other interfaces at all (the `host` key)."""
    return _has(stack.router, "host")


def _sections(stack: StackConfig):
    """(name, config) of every config that may name a secret file, the file's own section first."""
    yield "security", stack.security
    for name, config in (("router", stack.router), *((f"targets-{i}", t) for i, t in enumerate(stack.targets)),
                         *((f"drafts-{i}", d) for i, d in enumerate(stack.drafts))):
        yield name, config
        if isinstance(getattr(config, "security", None), SecurityConfig):
            yield f"{name}-security", config.security


def _secret_fields(config) -> dict[str, str]:
    """{field: local path} of a config's secret files (a SecurityConfig's files, the router's key files)."""
    names = (tuple(f.name for f in dataclasses.fields(config) if f.name.endswith("_file"))
             if isinstance(config, SecurityConfig) else ("api_keys_file", "admin_keys_file"))
    return {name: getattr(config, name) for name in names if _has(config, name) and getattr(config, name)}


def secret_files(stack: StackConfig) -> dict[str, str]:
    """{secret key: local path} of every file holding a secret that the config names, each path once
    (a file the `security` section names keeps its key there, whichever component repeats it)."""
    key_of: dict[str, str] = {}
    for section_name, config in _sections(stack):
        for name, path in _secret_fields(config).items():
            key_of.setdefault(path, f"{section_name}-{name.replace('_', '-')}")
    return {key: path for path, key in key_of.items()}


def secret_env_names(stack: StackConfig) -> list[str]:
    return list(ENV_SECRETS)


def _mounted(config, where_of_path: dict[str, str]):
    """config with each secret file named at its mounted path (and its own security section likewise)."""
    changes = {name: f"{SECRETS_DIR}/{where_of_path[path]}" for name, path in _secret_fields(config).items()}
    if isinstance(getattr(config, "security", None), SecurityConfig):
        changes["security"] = _mounted(config.security, where_of_path)
    return dataclasses.replace(config, **changes) if changes else config


def in_cluster(stack: StackConfig) -> StackConfig:
    """`stack` as the pods run it: fixed ports, every interface, secrets at their mounted paths."""
    k8s = (stack.deploy or DeployConfig()).k8s
    key_of = {path: key for key, path in secret_files(stack).items()}
    security = _mounted(stack.security, key_of)

    def placed(config, port):
        config = _mounted(_bind_all(config, port), key_of)
        if getattr(config, "security", None) == security:  # the file's section again: written once, at the top
            config = dataclasses.replace(config, security=SecurityConfig())
        return config

    router = dataclasses.replace(placed(stack.router, k8s.router_port), http_port=k8s.http_port)
    return dataclasses.replace(stack, router=router, security=security,
                               targets=tuple(placed(t, k8s.target_port) for t in stack.targets),
                               drafts=tuple(placed(d, k8s.draft_port) for d in stack.drafts))


def to_mapping(value):
    """A config as YAML-ready data: dataclasses as mappings of their non-default fields, tuples as lists."""
    if dataclasses.is_dataclass(value):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            default = f.default if f.default is not dataclasses.MISSING else (
                f.default_factory() if f.default_factory is not dataclasses.MISSING else dataclasses.MISSING)
            if item != default or f.name in ("port", "http_port", "host", "model"):
                out[f.name] = to_mapping(item)
        return out
    if isinstance(value, (tuple, list)):
        return [to_mapping(v) for v in value]
    if isinstance(value, dict):
        return {k: to_mapping(v) for k, v in value.items()}
    return value


def config_text(stack: StackConfig, source: str | None) -> str:
    """The YAML of the in-cluster config (a header names the file it came from)."""
    import yaml

    header = (f"# Rendered by `specdec deploy up --k8s` from {source or 'the defaults'}: the same deployment with "
              f"fixed ports, every interface bound and secrets at {SECRETS_DIR}.\n")
    return header + yaml.safe_dump(to_mapping(in_cluster(stack)), sort_keys=False)


def read_secret_files(stack: StackConfig) -> dict[str, bytes]:
    """The secret files' contents (a missing file is an error: the pods would start without it)."""
    from specdec.errors import InvalidArgument

    out = {}
    for key, path in secret_files(stack).items():
        try:
            out[key] = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidArgument(f"cannot read {path!r} for the Kubernetes Secret: {exc}") from exc
    return out
