"""Property-based fuzzing (hypothesis) of the two doors a stranger or a broken peer can reach, on
127.0.0.1: GenerateRequests at a live router (any prompt kind, unicode, empty and oversized prompts,
any parameter values, chat messages with any roles, any sizes, and bytes that do not parse) and draft trees sent straight to a
target worker (any parents, tokens, q, versions and sizes). Each answer must be a documented one,
within its deadline (no hang), every server must stay up, and another user's greedy generation,
running throughout, must come out exactly as the engine's. Bounded in time: a fixed number of
examples (derandomized, so CI runs the same ones) and a deadline on every call."""
from __future__ import annotations

import itertools
import threading
import time
import uuid

import grpc
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from e2e.harness import running, running_stack, stack_config, wait_released
from router.limits import CHAT_ROLES
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.rpc.convert import params_to_pb
from specdec.rpc.server import channel_options
from specdec.rpc.v1 import common_pb2, generation_pb2, target_pb2, target_pb2_grpc
from specdec.serving_config import TargetConfig

pytestmark = pytest.mark.e2e
VOCAB = 49152
CONTEXT = 1024
INT64 = st.integers(-2 ** 63, 2 ** 63 - 1)
INT32 = st.integers(-2 ** 31, 2 ** 31 - 1)
FUZZ = settings(max_examples=150, deadline=None, derandomize=True, database=None, print_blob=True,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large])
VICTIM_PROMPT = [5, 6, 7, 8, 9]
VICTIM = SamplingParams(max_new_tokens=24, ignore_eos=True)
CALL_TIMEOUT_S = 30.0  # a documented answer comes long before this; reaching it means something hung
DOCUMENTED = {grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.RESOURCE_EXHAUSTED}  # for a healthy stack


class Victim:
    """Another user generating greedily over and over on a thread: every output, for checking."""

    def __init__(self, run_once):
        self.run_once, self.outputs, self.errors = run_once, [], []
        self.done = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.done.is_set():
            try:
                self.outputs.append(self.run_once())
            except Exception as exc:  # noqa: BLE001 - reported by the test
                self.errors.append(exc)

    def __enter__(self):
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.done.set()
        self.thread.join(timeout=60)


# -- GenerateRequest at the router ---------------------------------------------------------------------
text = st.text(st.characters(exclude_categories=("Cs",)), max_size=300)  # protobuf strings are UTF-8
repeated = st.builds(lambda piece, n: piece * n, st.sampled_from(["a", "é", "😀", "\x00", " ", "<|im_start|>"]),
                     st.sampled_from([1, 1000, 40_000, 200_000, 2_000_000]))
prompt_text = st.one_of(st.just(""), text, repeated)


@st.composite
def generate_requests(draw) -> bytes:
    """A serialized GenerateRequest, or now and then bytes that are none (random, or a text not UTF-8).
    Half of them are drawn `wild` (any values at all), half `tame` (within the limits, so that valid
    requests of every kind are generated too, and what streams is exercised)."""
    if draw(st.integers(0, 9)) == 0:
        return draw(st.one_of(st.binary(max_size=64), st.just(b"\x0a\x02\xff\xfe")))
    wild = draw(st.booleans())
    short = st.text(st.characters(exclude_categories=("Cs",)), min_size=1, max_size=60)
    request = generation_pb2.GenerateRequest(chat=draw(st.booleans()), user=draw(text | repeated if wild else text))
    kind = draw(st.sampled_from(["text", "messages", "token_ids"] + (["none"] if wild else [])))
    if kind == "text":
        request.text = draw(prompt_text if wild else short)
    elif kind == "messages":
        roles = st.one_of(st.sampled_from(CHAT_ROLES), text) if wild else st.sampled_from(CHAT_ROLES)
        contents = prompt_text if wild else short
        for role, content in draw(st.lists(st.tuples(roles, contents), min_size=0 if wild else 1, max_size=8)):
            request.messages.messages.add(role=role, content=content)
        if wild and draw(st.booleans()):
            request.messages.messages.extend([generation_pb2.ChatMessage(role="user", content="hi")]
                                             * draw(st.sampled_from([100, 600])))
    elif kind == "token_ids":
        in_vocab = st.integers(0, VOCAB - 1)
        ids = draw(st.lists(in_vocab | INT64 if wild else in_vocab, min_size=0 if wild else 1, max_size=40))
        request.token_ids.ids.extend(ids * (draw(st.sampled_from([1, 1, 30, 300])) if wild else 1))
    params = request.params
    fields = (("temperature", st.floats() | st.sampled_from([0.0, 1e-2, 1.0, 100.0, 100.5]),
               st.sampled_from([0.0, 0.7]) | st.floats(1e-2, 100.0)),
              ("top_p", st.floats() | st.sampled_from([1e-9, 0.5, 1.0]), st.floats(1e-3, 1.0)),
              ("top_k", INT64 | st.integers(0, 50), st.integers(0, 50)),
              ("seed", INT64, st.integers(0, 2 ** 63 - 1)),
              ("max_new_tokens", INT64 | st.integers(0, 8) | st.sampled_from([CONTEXT - 1, CONTEXT]),
               st.integers(1, 16)))
    for name, wild_values, tame_values in fields:
        if draw(st.booleans()):
            setattr(params, name, draw(wild_values if wild else tame_values))
    stops = st.lists(text, max_size=20) if wild else st.lists(short, max_size=4)
    params.stop.extend(draw(stops) + (draw(st.lists(repeated, max_size=1)) if wild else []))
    params.ignore_eos = draw(st.booleans())
    return request.SerializeToString()


def answer(generate, request: bytes) -> str:
    """'streamed' (the first few messages arrived; then cancelled), 'finished', or the status code's name."""
    call = generate(request, timeout=CALL_TIMEOUT_S)
    try:
        for i, response in enumerate(call):
            if response.HasField("final"):
                assert response.final.finish_reason in ("eos", "stop", "length")
                return "finished"
            if i >= 3:
                return "streamed"
        raise AssertionError("the stream ended without a final message")
    except grpc.RpcError as exc:
        assert exc.code() in DOCUMENTED and exc.details(), (exc.code(), exc.details())
        return exc.code().name
    finally:
        call.cancel()


def test_fuzzed_generate_requests(tiny_models, reference):
    expected = reference("ngram", VICTIM_PROMPT, VICTIM).token_ids
    outcomes: dict[str, int] = {}
    with running_stack(stack_config(tiny_models, "ngram")) as stack, \
            grpc.insecure_channel(stack.address, options=channel_options()) as channel, \
            Client(stack.address) as victim_client:
        generate = channel.unary_stream("/specdec.v1.Generation/Generate",  # sends the bytes as they are
                                        response_deserializer=generation_pb2.GenerateResponse.FromString)

        @FUZZ
        @given(request=generate_requests())
        def fuzz(request):
            outcome = answer(generate, request)
            outcomes[outcome] = outcomes.get(outcome, 0) + 1

        def victim_once():
            return victim_client.generate(VICTIM_PROMPT, VICTIM, timeout_s=60, user="victim").token_ids

        start = time.monotonic()
        with Victim(victim_once) as victim:
            fuzz()
        took_s = time.monotonic() - start
        wait_released(stack.address)  # every fuzzed sequence let go of at every worker
        info = victim_client.server_info()
        alive = [process.popen.poll() is None for process in (stack.router, *stack.targets, *stack.drafts)]
    assert not victim.errors and victim.outputs and all(out == expected for out in victim.outputs), victim.errors
    assert all(t.healthy for t in info.targets) and all(d.healthy for d in info.drafts)
    assert all(alive)
    assert {"INVALID_ARGUMENT"} < set(outcomes) and outcomes.keys() & {"streamed", "finished"}, outcomes
    print(f"{sum(outcomes.values())} fuzzed requests in {took_s:.1f} s: {outcomes}")


# -- draft trees at a target ---------------------------------------------------------------------------
@st.composite
def drafts(draw) -> dict:
    """A draft message's parts; `version` and `sequence` are relative to the sequence under fuzz."""
    num_nodes = draw(st.integers(0, 11))
    tokens = st.integers(0, VOCAB - 1) if draw(st.booleans()) else st.one_of(st.integers(0, VOCAB - 1), INT64)
    token_ids = draw(st.lists(tokens, min_size=num_nodes, max_size=num_nodes))
    shape = draw(st.sampled_from(["chain", "star", "random", "wrong length"]))
    if shape == "chain":
        parent_ids = list(range(-1, num_nodes - 1))
    elif shape == "star":
        parent_ids = [-1] * num_nodes
    elif shape == "random":
        parent_ids = draw(st.lists(st.integers(-3, num_nodes + 2) | INT32, min_size=num_nodes, max_size=num_nodes))
    else:
        parent_ids = draw(st.lists(st.integers(-1, num_nodes), max_size=num_nodes + 2))
    q = None
    if draw(st.booleans()):
        row = st.one_of(st.tuples(st.just("one-hot")), st.tuples(
            st.lists(st.integers(0, VOCAB - 1) | INT32, max_size=4), st.lists(st.floats(width=32), max_size=4)))
        q = draw(st.lists(row, min_size=max(num_nodes - 1, 0), max_size=num_nodes + 1))
    return dict(token_ids=token_ids, parent_ids=parent_ids, q=q,
                version=draw(st.sampled_from(["current", "current", "stale", "future", "huge"])),
                sequence=draw(st.sampled_from(["ours", "ours", "ours", "unknown"])))


def draft_message(parts: dict, seq_id: str, version: int) -> target_pb2.DraftMessage:
    tree = target_pb2.DraftTree(token_ids=parts["token_ids"], parent_ids=parts["parent_ids"])
    for i, row in enumerate(parts["q"] or ()):
        if row == ("one-hot",):
            token = parts["token_ids"][i] if i < len(parts["token_ids"]) else 0
            tree.q.add(token_ids=[token if -2 ** 31 <= token < 2 ** 31 else 0], probs=[1.0])
        else:
            tree.q.add(token_ids=row[0], probs=row[1])
    versions = {"current": version, "stale": version - 1, "future": version + 1, "huge": 2 ** 64 - 1}
    return target_pb2.DraftMessage(sequence_id=seq_id if parts["sequence"] == "ours" else "no-such-" + seq_id,
                                   version=max(versions[parts["version"]], 0), tree=tree)


def test_fuzzed_draft_trees_at_a_target(tiny_models, reference):
    prompt, params = [11, 22, 33, 44], SamplingParams(max_new_tokens=200, ignore_eos=True)
    expected = reference("none", prompt, params).token_ids
    victim_params = SamplingParams(max_new_tokens=48, ignore_eos=True)
    victim_expected = reference("none", VICTIM_PROMPT, victim_params).token_ids
    config = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, draft_wait_s=60.0,
                          max_tree_nodes=8, load_aware=False)
    kinds: dict[str, int] = {}
    with running("target", config) as target, grpc.insecure_channel(target.address) as channel:
        stub = target_pb2_grpc.TargetWorkerStub(channel)
        outbox: list = []
        ready = threading.Condition()
        link = stub.Verify(iter(lambda: _take(outbox, ready), None), timeout=600)
        counter = itertools.count()

        def put(message) -> None:
            with ready:
                outbox.append(message)
                ready.notify()

        def send(message) -> target_pb2.VerifyMessage:
            put(message)
            return next(link)

        @FUZZ
        @given(parts=st.lists(drafts(), min_size=1, max_size=4))
        def fuzz(parts):
            seq_id = f"fuzz-{next(counter)}"
            commits = stub.Admit(target_pb2.AdmitRequest(sequence_id=seq_id, prompt_ids=prompt,
                                                         params=params_to_pb(params), expect_drafts=True),
                                 timeout=CALL_TIMEOUT_S)
            try:
                assert next(commits).version == 0
                first = send(target_pb2.DraftMessage(sequence_id=seq_id, version=0))  # a plain step: a past to be stale on
                version, generated = 1, list(first.commit.token_ids)
                assert first.commit.version == 1 and generated == expected[:1]
                for part in parts:
                    message = draft_message(part, seq_id, version)
                    reply = send(message)
                    assert reply.sequence_id == message.sequence_id
                    if reply.HasField("commit"):  # verified: the greedy tokens, whatever was drafted
                        assert message.sequence_id == seq_id and reply.commit.version == version + 1
                        generated += reply.commit.token_ids
                        version = reply.commit.version
                        assert generated == expected[:len(generated)]
                        kinds["commit"] = kinds.get("commit", 0) + 1
                    else:
                        refusal = reply.refusal
                        assert refusal.reason and refusal.kind in (
                            target_pb2.Refusal.STALE, target_pb2.Refusal.MALFORMED, target_pb2.Refusal.UNKNOWN_SEQUENCE)
                        assert (refusal.kind == target_pb2.Refusal.UNKNOWN_SEQUENCE) == (message.sequence_id != seq_id)
                        name = target_pb2.Refusal.Kind.Name(refusal.kind)
                        kinds[name] = kinds.get(name, 0) + 1
            finally:
                commits.cancel()
                stub.Release(common_pb2.ReleaseRequest(sequence_id=seq_id), timeout=CALL_TIMEOUT_S)

        def victim_once():
            call = stub.Admit(target_pb2.AdmitRequest(sequence_id=uuid.uuid4().hex, prompt_ids=VICTIM_PROMPT,
                                                      params=params_to_pb(victim_params)), timeout=CALL_TIMEOUT_S)
            return [t for commit in call for t in commit.token_ids]

        start = time.monotonic()
        try:
            with Victim(victim_once) as victim:
                fuzz()
        finally:
            put(None)  # ends the draft stream
            link.cancel()
        took_s = time.monotonic() - start
        info = stub.GetWorkerInfo(common_pb2.WorkerInfoRequest(), timeout=10)
        alive = target.popen.poll() is None
    assert not victim.errors and victim.outputs and all(out == victim_expected for out in victim.outputs)
    assert list(info.sequence_ids) == [] and alive
    assert {"commit", "MALFORMED", "STALE", "UNKNOWN_SEQUENCE"} <= set(kinds), kinds
    print(f"fuzzed drafts in {took_s:.1f} s: {kinds}")


def _take(outbox: list, ready: threading.Condition):
    with ready:
        while not outbox:
            ready.wait()
        return outbox.pop(0)
