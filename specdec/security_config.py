"""Who may call the serving processes: the `security` section of a deployment, secrets read from
files or the environment, and the addresses a server binds and advertises.

No gRPC here (the router's HTTP side and the client SDK read the same things); specdec.rpc.security
turns a SecurityConfig into credentials and interceptors.

Two layers, see docs/architecture.md ("Security model"):
- internal services (TargetWorker, DraftWorker) accept only authenticated peers when a section is
  configured: mutual TLS (a certificate signed by `tls_ca_file`) and/or the shared token;
- the public Generation service and the HTTP API check API keys (router.api_keys_file /
  SPECDEC_API_KEYS), and GetServerInfo details need an admin key (router.admin_keys_file /
  SPECDEC_ADMIN_KEYS).
`insecure: true` (`--insecure`), or no section at all, is the local stack of before: plaintext, every
peer trusted. A server in that mode says so at start when it binds anything but loopback.
"""
from __future__ import annotations

import ipaddress
import os
import socket
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping

from specdec.errors import InvalidArgument

TOKEN_ENV = "SPECDEC_INTERNAL_TOKEN"  # the shared token of internal calls, when no token_file is given
API_KEYS_ENV = "SPECDEC_API_KEYS"  # the router's API keys (comma-separated), besides router.api_keys_file
ADMIN_KEYS_ENV = "SPECDEC_ADMIN_KEYS"  # its admin keys, besides router.admin_keys_file
LOOPBACK = "127.0.0.1"
WILDCARDS = ("0.0.0.0", "::", "[::]", "")


@dataclass(frozen=True)
class SecurityConfig:
    # Ignore everything below: plaintext, every peer trusted (the local stack of before).
    insecure: bool = False
    # PEM certificate and key this process presents, as a server and as a client of other servers.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    # PEM CA bundle: servers' certificates must chain to it, and with it workers require a client
    # certificate that chains to it too (mutual TLS). None = the system's roots, no client certificates.
    tls_ca_file: str | None = None
    # The name servers' certificates are checked against when it is not the host dialled (a certificate
    # for "specdec-target" reached at 10.0.0.7, say). None = the host dialled.
    tls_server_name: str | None = None
    # A shared secret that every internal call must carry (`authorization: Bearer TOKEN`); the first line
    # of this file, or env SPECDEC_INTERNAL_TOKEN when no file is given.
    token_file: str | None = None

    def __post_init__(self) -> None:
        if bool(self.tls_cert_file) != bool(self.tls_key_file):
            raise InvalidArgument("security: tls_cert_file and tls_key_file go together (a certificate and its key)")

    @property
    def tls(self) -> bool:
        """Whether connections use TLS (a certificate to present or a CA to check servers against)."""
        return not self.insecure and bool(self.tls_cert_file or self.tls_ca_file)

    @property
    def mutual_tls(self) -> bool:
        return self.tls and bool(self.tls_cert_file and self.tls_ca_file)

    def token(self, environ: Mapping[str, str] = os.environ) -> str | None:
        """The internal token (None: not configured, or insecure)."""
        if self.insecure:
            return None
        if self.token_file:
            lines = [line.strip() for line in read_secret(self.token_file, "token_file").splitlines()]
            token = next((line for line in lines if line and not line.startswith("#")), "")
            if not token:
                raise InvalidArgument(f"token_file {self.token_file!r} holds no token")
            return token
        return environ.get(TOKEN_ENV, "").strip() or None

    def enabled(self, environ: Mapping[str, str] = os.environ) -> bool:
        """Whether internal peers are authenticated (TLS with a CA, and/or a token)."""
        return self.mutual_tls or self.token(environ) is not None


def read_secret(path: str, what: str) -> str:
    try:
        return Path(path).read_text()
    except OSError as exc:
        raise InvalidArgument(f"cannot read {what} {path!r}: {exc}") from exc


def read_keys(path: str | None, env_name: str, what: str, environ: Mapping[str, str] = os.environ) -> tuple[str, ...]:
    """Keys from env `env_name` (comma-separated) and a file (one per line; blank lines and `#` comments
    skipped). A file that holds no key is refused: it must not silently switch a check off."""
    keys = [k.strip() for k in environ.get(env_name, "").split(",") if k.strip()]
    if path:
        lines = read_secret(path, what).splitlines()
        from_file = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
        if not from_file:
            raise InvalidArgument(f"{what} {path!r} holds no key")
        keys += from_file
    return tuple(keys)


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps a server reachable from this machine only."""
    name = host.strip("[]")
    if name in WILDCARDS:
        return False
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        pass
    try:
        return all(ipaddress.ip_address(info[4][0]).is_loopback for info in socket.getaddrinfo(name, None))
    except (OSError, ValueError):
        return False


def advertised_host(host: str, advertise_host: str | None) -> str:
    """The host others dial: advertise_host, else the bind host, else (a wildcard bind) this machine's name."""
    if advertise_host:
        return advertise_host
    return socket.gethostname() if host.strip("[]") in WILDCARDS else host


def join_host_port(host: str, port: int) -> str:
    """host:port, with an IPv6 literal in brackets."""
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    return f"{host}:{port}"


def insecure_notice(kind: str, host: str, security: SecurityConfig, environ: Mapping[str, str] = os.environ
                    ) -> str | None:
    """The one line a server prints at start when it serves without authentication beyond loopback."""
    if is_loopback(host) or security.enabled(environ):
        return None
    why = "--insecure" if security.insecure else "no security section (TLS certificates or a token)"
    if kind == "router":  # its callers are users (API keys, if configured, still apply)
        plaintext = "" if security.tls and security.tls_cert_file else (
            ", and requests, API keys and text cross the network in plaintext")
        return (f"specdec router: WARNING: insecure mode on {host} ({why}): its calls to workers carry no "
                f"credentials{plaintext}")
    return (f"specdec {kind}: WARNING: serving without authentication on {host} ({why}): anyone who can reach "
            f"this port can call every RPC of it")
