"""The deployment file as the pods read it: the same file, with what a cluster changes.

- Fixed ports (deploy.k8s.*_port): port 0 cannot be probed or put behind a Service.
- Servers bind every interface where the config has a `host` key (the kubelet's probes and the other
  pods must reach them); each advertises its pod's address (specdec.deploy.actors.placed_on_node).
- Files with secrets (the router's `api_keys_file`, and in a `security` section every `*_file` /
  `*_path` key: certificates, keys, CAs, tokens) travel as a Secret mounted at SECRETS_DIR, and the
  config names them there. Keys `*_env` (names of environment variables holding a secret) and
  SPECDEC_API_KEYS come into every container from a second Secret, filled from the environment of the
  machine that renders (never written into the repository: `secret.yaml` is git-ignored).
"""
from __future__ import annotations

import dataclasses
from pathlib import Path

from specdec.deploy.config import DeployConfig
from specdec.serving_config import StackConfig

CONFIG_DIR = "/etc/specdec"
SECRETS_DIR = "/etc/specdec/secrets"
CONFIG_FILE = f"{CONFIG_DIR}/config.yaml"
ENV_SECRETS = ("SPECDEC_API_KEYS",)  # read by the router when set


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


def secret_files(stack: StackConfig) -> dict[str, str]:
    """{secret key: local path} of every file holding a secret that the config names."""
    files = {}
    if stack.router.api_keys_file:
        files["router-api-keys"] = stack.router.api_keys_file
    security = getattr(stack, "security", None)
    if security is not None and dataclasses.is_dataclass(security):
        for f in dataclasses.fields(security):
            value = getattr(security, f.name)
            if isinstance(value, str) and value and f.name.endswith(("_file", "_path")):
                files[f"security-{f.name.replace('_', '-')}"] = value
    return files


def secret_env_names(stack: StackConfig) -> list[str]:
    names = list(ENV_SECRETS)
    security = getattr(stack, "security", None)
    if security is not None and dataclasses.is_dataclass(security):
        names += [getattr(security, f.name) for f in dataclasses.fields(security)
                  if f.name.endswith("_env") and isinstance(getattr(security, f.name), str) and getattr(security, f.name)]
    return list(dict.fromkeys(names))


def in_cluster(stack: StackConfig) -> StackConfig:
    """`stack` as the pods run it: fixed ports, every interface, secrets at their mounted paths."""
    k8s = (stack.deploy or DeployConfig()).k8s
    router = dataclasses.replace(_bind_all(stack.router, k8s.router_port), http_port=k8s.http_port)
    if router.api_keys_file:
        router = dataclasses.replace(router, api_keys_file=f"{SECRETS_DIR}/router-api-keys")
    changes = {"router": router,
               "targets": tuple(_bind_all(t, k8s.target_port) for t in stack.targets),
               "drafts": tuple(_bind_all(d, k8s.draft_port) for d in stack.drafts)}
    security = getattr(stack, "security", None)
    if security is not None and dataclasses.is_dataclass(security):
        mounted = {f.name: f"{SECRETS_DIR}/security-{f.name.replace('_', '-')}" for f in dataclasses.fields(security)
                   if f.name.endswith(("_file", "_path")) and getattr(security, f.name)}
        changes["security"] = dataclasses.replace(security, **mounted)
    return dataclasses.replace(stack, **changes)


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
