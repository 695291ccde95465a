"""The security section's rules without servers: loopback, advertised addresses, the insecure notice,
tokens, per-sequence keys, and who sees GetServerInfo's details."""
from __future__ import annotations

import pytest

from router.api_keys import ApiKeys
from router.server import withhold_details
from specdec.errors import InvalidArgument
from specdec.keys import key_matches, new_key
from specdec.rpc.security import bearer
from specdec.rpc.v1 import generation_pb2
from specdec.security_config import (SecurityConfig, advertised_host, insecure_notice, is_loopback, join_host_port)


@pytest.mark.parametrize("host, loopback", [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True),
                                            ("[::1]", True), ("localhost", True), ("0.0.0.0", False),
                                            ("::", False), ("10.1.2.3", False)])
def test_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_advertised_address():
    assert advertised_host("127.0.0.1", None) == "127.0.0.1"
    assert advertised_host("0.0.0.0", "target-0.specdec") == "target-0.specdec"
    assert advertised_host("0.0.0.0", None) not in ("", "0.0.0.0")  # this machine's name
    assert join_host_port("::1", 5) == "[::1]:5" and join_host_port("10.0.0.1", 5) == "10.0.0.1:5"


def test_the_insecure_notice_is_said_beyond_loopback_only(tmp_path):
    token = tmp_path / "token"
    token.write_text("# shared\nsecret-1\n")
    assert insecure_notice("target", "127.0.0.1", SecurityConfig(), environ={}) is None
    notice = insecure_notice("target", "0.0.0.0", SecurityConfig(insecure=True, token_file=str(token)), environ={})
    assert "--insecure" in notice and "0.0.0.0" in notice and "\n" not in notice
    assert "no security section" in insecure_notice("draft", "10.0.0.7", SecurityConfig(), environ={})
    assert "plaintext" in insecure_notice("router", "0.0.0.0", SecurityConfig(), environ={})
    assert insecure_notice("target", "0.0.0.0", SecurityConfig(token_file=str(token)), environ={}) is None
    assert insecure_notice("target", "0.0.0.0", SecurityConfig(), environ={"SPECDEC_INTERNAL_TOKEN": "t"}) is None


def test_tokens_from_a_file_or_the_environment(tmp_path):
    token = tmp_path / "token"
    token.write_text("# shared\nsecret-1\n")
    assert SecurityConfig(token_file=str(token)).token(environ={}) == "secret-1"
    assert SecurityConfig().token(environ={"SPECDEC_INTERNAL_TOKEN": " t2 "}) == "t2"
    assert SecurityConfig(insecure=True, token_file=str(token)).token(environ={}) is None
    (tmp_path / "empty").write_text("\n# nothing\n")
    with pytest.raises(InvalidArgument, match="holds no token"):
        SecurityConfig(token_file=str(tmp_path / "empty")).token(environ={})
    with pytest.raises(InvalidArgument, match="cannot read token_file"):
        SecurityConfig(token_file=str(tmp_path / "missing")).token(environ={})
    assert bearer((("authorization", "Bearer abc"),)) == "abc" and bearer((("authorization", "abc"),)) == ""


def test_tls_needs_a_certificate_and_its_key():
    with pytest.raises(InvalidArgument, match="go together"):
        SecurityConfig(tls_cert_file="/c")
    assert SecurityConfig(tls_ca_file="/ca").tls and not SecurityConfig(tls_ca_file="/ca").mutual_tls
    assert not SecurityConfig(insecure=True, tls_cert_file="/c", tls_key_file="/k", tls_ca_file="/ca").tls


def test_sequence_keys():
    key = new_key()
    assert len(key) == 32 and key != new_key()
    assert key_matches(key, key) and not key_matches(key, "") and not key_matches(key, new_key())
    assert key_matches("", "anything")  # an unkeyed sequence (admitted without one) is open


def test_who_sees_server_details(tmp_path):
    (tmp_path / "admin").write_text("boss\n")
    open_stack = ApiKeys.load(None, environ={})
    assert open_stack.shows_details(None)  # no key, no security section: as before
    admins = ApiKeys.load(None, environ={"SPECDEC_API_KEYS": "user"}, admin_path=str(tmp_path / "admin"))
    assert admins.shows_details("Bearer boss") and not admins.shows_details("Bearer user")
    admins.check("Bearer boss")  # an admin key is an API key too
    secured = ApiKeys.load(None, environ={}, secured=True)
    assert not secured.shows_details(None) and not secured.enabled  # secured, no admin key: nobody
    info = generation_pb2.ServerInfo(num_active=2)
    info.targets.add(address="10.0.0.1:5", healthy=True).info.sequence_ids.append("abc")
    info.drafts.add(address="10.0.0.2:6")
    info.users.add(user="alice", num_active=2)
    withhold_details(info)
    assert info.targets[0].address == "" and not info.targets[0].info.sequence_ids and info.targets[0].healthy
    assert info.drafts[0].address == "" and not info.users and info.num_active == 2


def test_serve_flags_reach_every_server():
    from specdec.cli import build_parser
    from specdec.commands.serve import stack_config
    from specdec.config_fields import config_from_args
    from specdec.serving_config import DraftConfig, TargetConfig

    config = stack_config(build_parser().parse_args(["serve", "--host", "0.0.0.0", "--insecure"]))
    for component in (config.router, *config.targets, *config.drafts):
        assert component.host == "0.0.0.0" and component.security.insecure
    assert config.security.insecure
    args = build_parser().parse_args(["serve", "target", "--host", "10.0.0.1", "--advertise-host", "t0.internal",
                                      "--tls-cert-file", "/c", "--tls-key-file", "/k", "--drain-timeout-s", "5"])
    assert config_from_args(args, TargetConfig) == TargetConfig(
        host="10.0.0.1", advertise_host="t0.internal", drain_timeout_s=5.0,
        security=SecurityConfig(tls_cert_file="/c", tls_key_file="/k"))
    with pytest.raises(InvalidArgument, match="go together"):
        config_from_args(build_parser().parse_args(["serve", "draft", "--tls-cert-file", "/c"]), DraftConfig)


def test_unreadable_certificates_are_one_line_errors(tmp_path):
    from specdec.rpc.security import server_credentials

    with pytest.raises(InvalidArgument, match="cannot read tls_key_file"):
        server_credentials(SecurityConfig(tls_cert_file=str(tmp_path / "c"), tls_key_file=str(tmp_path / "k")), True)
    with pytest.raises(InvalidArgument, match="needs tls_cert_file"):
        server_credentials(SecurityConfig(tls_ca_file=str(tmp_path / "ca")), True)
