"""A stack with mutual TLS, an internal token, API keys and an admin key (certificates made here).

- A peer without a certificate, with a certificate from another CA, or without the token gets
  UNAVAILABLE or UNAUTHENTICATED on every internal RPC; without an API key, on every public one.
- GetServerInfo shows worker addresses, sequence ids and users to the admin key only.
- The attacks measured on the open stack, replayed by an authenticated but different peer (its own
  certificate from the same CA, and the token) while a victim generates: Release of the victim's
  sequence at the target or the draft worker (it ended the victim's stream); a Verify stream naming the
  victim's sequence (it received the victim's whole context and every later commit); drafts with a
  forged q = 1e-30 (they put injected tokens into a sampled victim). Each is refused, and the victim's
  output is identical to an undisturbed run.
"""
from __future__ import annotations

import contextlib
import dataclasses
import http.client
import queue
import ssl
import threading
import time

import grpc
import pytest

from e2e.certs import Authority
from e2e.harness import running, running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.errors import Unauthenticated
from specdec.loadtest_http import http_stream
from specdec.rpc.security import open_channel
from specdec.rpc.v1 import (common_pb2, draft_pb2, draft_pb2_grpc, generation_pb2, generation_pb2_grpc, target_pb2,
                            target_pb2_grpc)
from specdec.security_config import SecurityConfig

pytestmark = pytest.mark.e2e
PROMPT = [11, 22, 33, 44, 11, 22, 33]
GREEDY = SamplingParams(max_new_tokens=300, ignore_eos=True)
SAMPLED = SamplingParams(temperature=1.0, seed=7, max_new_tokens=300, ignore_eos=True)
API_KEY, ADMIN_KEY, TOKEN = "user-key-1", "admin-key-1", "internal-token-1"


@pytest.fixture(scope="module")
def secrets(tmp_path_factory):
    """Paths and SecurityConfigs: the stack's, an authenticated attacker's, and a client's (CA only)."""
    root = tmp_path_factory.mktemp("secrets")
    ca, foreign = Authority(root, "specdec-ca"), Authority(root, "foreign-ca")
    (root / "token").write_text(TOKEN + "\n")
    (root / "api_keys").write_text(f"# users\n{API_KEY}\n")
    (root / "admin_keys").write_text(ADMIN_KEY + "\n")
    cert, key = ca.issue("specdec")
    stack = SecurityConfig(tls_cert_file=str(cert), tls_key_file=str(key), tls_ca_file=str(ca.ca_file),
                           token_file=str(root / "token"))
    attacker_cert, attacker_key = ca.issue("attacker")
    stranger_cert, stranger_key = foreign.issue("stranger")
    return {"root": root, "stack": stack,
            "attacker": dataclasses.replace(stack, tls_cert_file=str(attacker_cert), tls_key_file=str(attacker_key)),
            "stranger": dataclasses.replace(stack, tls_cert_file=str(stranger_cert), tls_key_file=str(stranger_key)),
            "no_token": dataclasses.replace(stack, token_file=None),
            "no_cert": SecurityConfig(tls_ca_file=str(ca.ca_file), token_file=str(root / "token")),
            "client": SecurityConfig(tls_ca_file=str(ca.ca_file))}


@pytest.fixture(scope="module")
def stacks(tiny_models, secrets):
    """The secured stack (router, target, ngram draft worker) and, on the same target, a second router
    without a draft worker (its sampled sequences decode plainly, so a seeded run repeats exactly)."""
    config = stack_config(tiny_models, "ngram")
    router = dataclasses.replace(config.router, api_keys_file=str(secrets["root"] / "api_keys"),
                                 admin_keys_file=str(secrets["root"] / "admin_keys"), http_port=0)
    secure = lambda c: dataclasses.replace(c, security=secrets["stack"])  # noqa: E731
    config = dataclasses.replace(config, router=secure(router), targets=tuple(map(secure, config.targets)),
                                 drafts=tuple(map(secure, config.drafts)), security=secrets["stack"])
    with running_stack(config) as stack:
        plain = dataclasses.replace(config.router, targets=(stack.targets[0].address,), drafts=(), http_port=-1)
        with running("router", plain) as plain_router:
            yield stack, plain_router.address


def client(address: str, secrets, key: str = API_KEY) -> Client:
    return Client(address, api_key=key, security=secrets["client"])


# -- peers without credentials ------------------------------------------------------------------

def internal_calls(stack):
    """(name, address, call(channel)) for every RPC of the internal services."""
    target, draft = stack.targets[0].address, stack.drafts[0].address
    t = lambda ch: target_pb2_grpc.TargetWorkerStub(ch)  # noqa: E731
    d = lambda ch: draft_pb2_grpc.DraftWorkerStub(ch)  # noqa: E731
    return [
        ("TargetWorker/Admit", target, lambda ch: next(t(ch).Admit(target_pb2.AdmitRequest(
            sequence_id="x", prompt_ids=[1, 2]), timeout=10))),
        ("TargetWorker/Release", target, lambda ch: t(ch).Release(common_pb2.ReleaseRequest(sequence_id="x"),
                                                                   timeout=10)),
        ("TargetWorker/Verify", target, lambda ch: next(t(ch).Verify(iter([target_pb2.DraftMessage(
            sequence_id="x")]), timeout=10))),
        ("TargetWorker/GetWorkerInfo", target, lambda ch: t(ch).GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                                                               timeout=10)),
        ("DraftWorker/Attach", draft, lambda ch: d(ch).Attach(draft_pb2.AttachRequest(
            sequence_id="x", target_address=target, prompt_ids=[1, 2]), timeout=10)),
        ("DraftWorker/Release", draft, lambda ch: d(ch).Release(common_pb2.ReleaseRequest(sequence_id="x"),
                                                                 timeout=10)),
        ("DraftWorker/GetWorkerInfo", draft, lambda ch: d(ch).GetWorkerInfo(common_pb2.WorkerInfoRequest(),
                                                                             timeout=10)),
    ]


def public_calls(stack):
    g = lambda ch: generation_pb2_grpc.GenerationStub(ch)  # noqa: E731
    return [
        ("Generation/Generate", stack.address, lambda ch: next(g(ch).Generate(generation_pb2.GenerateRequest(
            text="hi"), timeout=10))),
        ("Generation/GetServerInfo", stack.address, lambda ch: g(ch).GetServerInfo(
            generation_pb2.GetServerInfoRequest(), timeout=10)),
    ]


def refusal(call, channel) -> grpc.StatusCode | None:
    try:
        call(channel)
    except grpc.RpcError as exc:
        return exc.code()
    return None


@pytest.mark.parametrize("peer", ["plaintext", "no_cert", "stranger", "no_token"])
def test_a_peer_without_credentials_gets_nothing_from_any_rpc(stacks, secrets, peer):
    """plaintext: no TLS at all; no_cert: TLS and the token but no client certificate; stranger: a
    certificate from another CA; no_token: a valid certificate but no token."""
    stack, _ = stacks
    expected = {"plaintext": {grpc.StatusCode.UNAVAILABLE}, "no_cert": {grpc.StatusCode.UNAVAILABLE},
                "stranger": {grpc.StatusCode.UNAVAILABLE}, "no_token": {grpc.StatusCode.UNAUTHENTICATED}}[peer]
    for name, address, call in internal_calls(stack) + public_calls(stack):
        public = name.startswith("Generation/")
        if peer == "plaintext":
            channel = grpc.insecure_channel(address)
        else:  # the router's public port asks for no client certificate: API keys decide there
            channel = open_channel(address, secrets["client"] if public else secrets[peer])
        with channel:
            code = refusal(call, channel)
        allowed = {grpc.StatusCode.UNAUTHENTICATED} if public and peer != "plaintext" else expected
        assert code in allowed, f"{peer} peer calling {name}: {code}"


def test_api_keys_and_admin_details(stacks, secrets):
    stack, _ = stacks
    for key in ("", "wrong-key"):
        with client(stack.address, secrets, key) as stranger, pytest.raises(Unauthenticated):
            stranger.generate(PROMPT, SamplingParams(max_new_tokens=2), timeout_s=30)
    with client(stack.address, secrets) as user, client(stack.address, secrets, ADMIN_KEY) as admin:
        long = SamplingParams(max_new_tokens=1000, ignore_eos=True)
        stream = user.stream(PROMPT, long, timeout_s=60, user="alice")
        next(stream)  # running now: it has a sequence at the target, a user, a draft worker
        seen, shown = user.server_info(), admin.server_info()
        stream.close()
    assert [t.address for t in shown.targets] == [stack.targets[0].address] and shown.targets[0].info.sequence_ids
    assert [d.address for d in shown.drafts] == [stack.drafts[0].address]
    assert [u.user for u in shown.users] == ["alice"]
    assert [t.address for t in seen.targets] == [""] and not seen.targets[0].info.sequence_ids
    assert [d.address for d in seen.drafts] == [""] and not seen.users
    assert seen.num_active == shown.num_active == 1 and seen.model_path == shown.model_path  # figures stay


def test_the_http_api_serves_https_with_the_same_keys(stacks, secrets):
    stack, _ = stacks
    host, port = stack.http_address.rsplit(":", 1)
    with pytest.raises((http.client.HTTPException, OSError)):  # plaintext to the TLS port
        plain = http.client.HTTPConnection(host, int(port), timeout=10)
        plain.request("GET", "/v1/models")
        plain.getresponse().read()
    context = ssl.create_default_context(cafile=secrets["client"].tls_ca_file)
    for headers, status in (({}, 401), ({"Authorization": "Bearer nope"}, 401),
                            ({"Authorization": f"Bearer {API_KEY}"}, 200)):
        connection = http.client.HTTPSConnection(host, int(port), timeout=10, context=context)
        connection.request("GET", "/v1/models", headers=headers)
        assert connection.getresponse().status == status
        connection.close()
    session, stream = http_stream(f"https://{stack.http_address}", 60, api_key=API_KEY, security=secrets["client"])
    with contextlib.closing(session):  # the load test's HTTP transport, with the deployment's CA and key
        chunks = list(stream("Hi", SamplingParams(max_new_tokens=4, ignore_eos=True)))
    assert sum(n for n, _ in chunks) == 4 and chunks[-1][1].num_new_tokens == 4


# -- attacks by an authenticated peer ----------------------------------------------------------

def victim_ids(worker: str, secrets, timeout_s: float = 30.0,
               stub_cls=target_pb2_grpc.TargetWorkerStub) -> list[str]:
    """The sequence ids a worker holds, once it holds one (an authenticated peer may ask)."""
    deadline = time.monotonic() + timeout_s
    with open_channel(worker, secrets["attacker"]) as channel:
        stub = stub_cls(channel)
        while time.monotonic() < deadline:
            ids = list(stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=5).sequence_ids)
            if ids:
                return ids
            time.sleep(0.005)
    raise AssertionError("the victim's sequence never appeared")


def wait_idle(target: str, secrets, timeout_s: float = 30.0) -> None:
    """Until the target holds no sequence (the last run's release can trail its stream's end): an attack
    must find the victim's sequence, not the one before it."""
    deadline = time.monotonic() + timeout_s
    with open_channel(target, secrets["attacker"]) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        while stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=5).sequence_ids:
            assert time.monotonic() < deadline, "the target still holds an earlier sequence"
            time.sleep(0.01)


def run_victim(address: str, secrets, params: SamplingParams, attack=None):
    """The victim's tokens; with `attack`, run on a thread while it generates: (tokens, what it returned)."""
    seen: list = []
    thread = None
    if attack is not None:
        thread = threading.Thread(target=lambda: seen.append(attack()), daemon=True)
        thread.start()
    with client(address, secrets) as victim:
        tokens = victim.generate(PROMPT, params, timeout_s=120).token_ids
    if thread is None:
        return tokens
    thread.join(60)
    assert not thread.is_alive() and seen, "the attack did not finish"
    return tokens, seen[0]


def release_at(worker: str, stub_cls, target: str, secrets):
    wait_idle(target, secrets)

    def attack():
        with open_channel(worker, secrets["attacker"]) as channel:
            grpc.channel_ready_future(channel).result(timeout=30)  # TLS done before the victim is found
            seq_id = victim_ids(worker, secrets, stub_cls=stub_cls)[0]  # the draft worker attaches after admission
            return refusal(lambda ch: stub_cls(ch).Release(common_pb2.ReleaseRequest(sequence_id=seq_id), timeout=5),
                           channel)
    return attack


def forged_drafts(target: str, secrets, duration_s: float = 3.0, token_id: int = 42):
    """A Verify stream naming the victim's sequence: asks for its state with a stale draft, then sends
    chains of `token_id` claiming q = 1e-30 at every version it learns. Returns every message received."""
    wait_idle(target, secrets)

    def attack():
        seq_id = victim_ids(target, secrets)[0]
        outbox: queue.Queue = queue.Queue()
        received: list = []
        with open_channel(target, secrets["attacker"]) as channel:
            call = target_pb2_grpc.TargetWorkerStub(channel).Verify(iter(outbox.get, None), timeout=duration_s + 10)

            def forge(version: int) -> None:
                tree = target_pb2.DraftTree(token_ids=[token_id] * 4, parent_ids=[-1, 0, 1, 2])
                for _ in range(4):
                    tree.q.add(token_ids=[token_id, token_id + 1], probs=[1e-30, 1.0])
                outbox.put(target_pb2.DraftMessage(sequence_id=seq_id, version=version, tree=tree))

            def read() -> None:
                try:
                    for message in call:
                        received.append(message)
                        if message.HasField("commit"):
                            forge(message.commit.version)
                        elif message.refusal.kind == target_pb2.Refusal.STALE:
                            forge(message.refusal.current_version)
                except grpc.RpcError:
                    pass

            reader = threading.Thread(target=read, daemon=True)
            reader.start()
            deadline = time.monotonic() + duration_s
            while time.monotonic() < deadline:
                outbox.put(target_pb2.DraftMessage(sequence_id=seq_id, version=0))  # stale: "tell me the state"
                time.sleep(0.05)
            outbox.put(None)
            call.cancel()
            reader.join(5)
        return seq_id, received
    return attack


def test_release_of_another_clients_sequence_is_refused(stacks, secrets):
    stack, _ = stacks
    undisturbed = run_victim(stack.address, secrets, GREEDY)
    target, draft = stack.targets[0].address, stack.drafts[0].address
    for worker, stub_cls in ((target, target_pb2_grpc.TargetWorkerStub), (draft, draft_pb2_grpc.DraftWorkerStub)):
        tokens, code = run_victim(stack.address, secrets, GREEDY, release_at(worker, stub_cls, target, secrets))
        assert code == grpc.StatusCode.PERMISSION_DENIED
        assert tokens == undisturbed


@pytest.mark.parametrize("which", ["greedy, with its draft worker", "sampled, decoding plainly"])
def test_a_foreign_verify_stream_learns_nothing_and_injects_nothing(stacks, secrets, which):
    stack, plain_router = stacks
    address, params = (stack.address, GREEDY) if which.startswith("greedy") else (plain_router, SAMPLED)
    undisturbed = run_victim(address, secrets, params)
    tokens, (seq_id, received) = run_victim(address, secrets, params, forged_drafts(stack.targets[0].address, secrets))
    assert received, "the target answered nothing"
    assert not [m for m in received if m.HasField("commit")], "the victim's commits reached a foreign stream"
    assert not [m for m in received if m.refusal.context_ids], "a refusal disclosed the victim's context"
    assert all(m.sequence_id == seq_id for m in received)
    kinds = {m.refusal.kind for m in received}
    assert target_pb2.Refusal.NOT_ATTACHED in kinds and kinds <= {target_pb2.Refusal.NOT_ATTACHED,
                                                                   target_pb2.Refusal.UNKNOWN_SEQUENCE}
    assert all(m.refusal.current_version == 0 for m in received)  # not even the version is disclosed
    assert tokens == undisturbed


def test_the_pods_health_probe_presents_the_configs_credentials(stacks, secrets, tmp_path):
    """deploy/k8s probes a TLS server with `python -m specdec.rpc.health_probe` (the kubelet's own gRPC
    probe is plaintext): SERVING with the deployment's security section, refused without it."""
    import yaml

    from specdec.rpc import health_probe

    stack, _ = stacks
    secured, bare = tmp_path / "secured.yaml", tmp_path / "bare.yaml"
    secured.write_text(yaml.safe_dump({"security": {k: v for k, v in dataclasses.asdict(secrets["stack"]).items()
                                                    if v not in (None, False)}}))
    bare.write_text("{}\n")
    for worker in (stack.targets[0].address, stack.drafts[0].address):
        assert health_probe.main([worker, "--config", str(secured)]) == 0
        assert health_probe.main([worker, "--config", str(bare), "--timeout-s", "2"]) == 1
