"""Through router -> draft worker -> target worker: greedy equals the in-process engine token for token, and
sampled tokens follow the target's exact distribution."""
from __future__ import annotations

import asyncio
import dataclasses
import threading
import time

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from specdec.client import AsyncClient, Client
from specdec.core.types import SamplingParams
from specdec.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted
from specdec.serving_config import RouterConfig
from distribution import assert_follows, exact_joint, target_next_probs
from e2e.harness import running

pytestmark = pytest.mark.e2e
GREEDY = SamplingParams(max_new_tokens=48, ignore_eos=True)
PROMPTS = ["The quick brown fox", [5, 17, 99, 3, 5, 17, 99, 3, 5, 17], "Once upon a time, in a land far away"]


@pytest.mark.parametrize("drafter", ["draft", "ngram", "suffix"])
def test_greedy_matches_in_process(request, reference, drafter):
    stack = request.getfixturevalue(f"{drafter}_stack")
    with Client(stack.address) as client:
        for prompt in PROMPTS:
            expected = reference(drafter, prompt, GREEDY)
            out = client.generate(prompt, GREEDY, timeout_s=60)
            assert out.token_ids == expected.token_ids
            assert out.text == expected.text
            assert out.finish_reason == expected.finish_reason == "length"
            assert out.stats.num_new_tokens == 48
        chat = client.generate("Say hi", SamplingParams(max_new_tokens=8, ignore_eos=True), chat=True, timeout_s=60)
        assert chat.prompt_token_ids == reference(drafter, "Say hi", SamplingParams(max_new_tokens=1), chat=True
                                                  ).prompt_token_ids


def test_draft_model_is_accepted_and_streamed(drafting_stack, reference):
    """On the stack that drafts at every step: the adaptive one may rightly decide drafting does not pay
    for a tiny target on a fast CPU, and then accepts nothing."""
    with Client(drafting_stack.address) as client:
        chunks = list(client.stream(PROMPTS[0], GREEDY, timeout_s=60))
    out = chunks[-1].output
    assert out.stats.num_accepted_tokens > 0 and out.stats.num_target_forwards < 48
    assert [t for c in chunks for t in c.token_ids] == out.token_ids
    assert "".join(c.text for c in chunks) == out.text


def test_suffix_draft_worker_learns_from_finished_requests(suffix_stack, reference):
    """The draft worker's global store gets each released sequence's output: the same request again is
    drafted from the first answer (fewer target forwards) and still decodes to the same tokens."""
    prompt = [8, 30, 2, 71, 9]
    with Client(suffix_stack.address) as client:
        first = client.generate(prompt, GREEDY, timeout_s=60)
        deadline = time.monotonic() + 10
        again = client.generate(prompt, GREEDY, timeout_s=60)
        while again.stats.num_target_forwards >= first.stats.num_target_forwards and time.monotonic() < deadline:
            again = client.generate(prompt, GREEDY, timeout_s=60)  # the release may trail the first answer
    assert first.token_ids == again.token_ids == reference("suffix", prompt, GREEDY).token_ids
    assert again.stats.num_target_forwards < first.stats.num_target_forwards
    assert again.stats.num_accepted_tokens > first.stats.num_accepted_tokens


def test_drafter_options_reach_the_draft_worker(tiny_models, reference):
    """drafter_options {"global_tokens": 0} switch the draft worker's global store off: unlike the test above,
    the same request again is drafted exactly as the first time (drafting every step, so the count of target
    forwards depends on the drafts alone), and still decodes to the in-process engine's tokens."""
    from e2e.harness import always_drafting, running_stack, stack_config

    config = always_drafting(stack_config(tiny_models, "suffix"), num_speculative_tokens=4)
    config = dataclasses.replace(config, drafts=(dataclasses.replace(config.drafts[0],
                                                                     drafter_options={"global_tokens": 0}),))
    prompt = [8, 30, 2, 71, 9]
    with running_stack(config) as stack, Client(stack.address) as client:
        first = client.generate(prompt, GREEDY, timeout_s=60)
        time.sleep(1.0)  # past the release that would feed a global store
        again = [client.generate(prompt, GREEDY, timeout_s=60) for _ in range(2)]
    assert all(out.token_ids == reference("suffix", prompt, GREEDY).token_ids for out in [first, *again])
    assert [out.stats.num_target_forwards for out in again] == [first.stats.num_target_forwards] * 2


def test_suffix_inside_the_target_worker(tiny_models, reference):
    """`--draft-in target`: suffix decoding drafts in the target worker (no draft worker, no round trip):
    greedy output still equals the in-process engine's, and the target's global store learns from a
    finished request as the draft worker's does."""
    import dataclasses

    from e2e.harness import running_stack, stack_config

    config = stack_config(tiny_models, "suffix")
    config = dataclasses.replace(config, drafts=(), targets=(dataclasses.replace(config.targets[0], drafter="suffix"),))
    prompt = [8, 30, 2, 71, 9, 4]
    with running_stack(config) as stack, Client(stack.address) as client:
        assert [t.info.drafter for t in client.server_info().targets] == ["suffix"]
        outputs = [client.generate(p, GREEDY, timeout_s=60) for p in PROMPTS + [prompt, prompt]]
    for p, out in zip(PROMPTS + [prompt, prompt], outputs):
        assert out.token_ids == reference("suffix", p, GREEDY).token_ids
    first, again = outputs[-2:]
    assert again.stats.num_target_forwards < first.stats.num_target_forwards


def test_served_demo_decodes_plainly_and_speculatively(suffix_stack, monkeypatch, capsys):
    """`make run`'s demo: the same request through the stack and through a drafter-less router on the
    same target worker; identical greedy output, the plain side really without drafts."""
    from specdec import demo

    monkeypatch.setattr(demo, "PARAMS", SamplingParams(max_new_tokens=24, ignore_eos=True))
    plain, spec = demo.served(suffix_stack, "suffix")
    assert plain.token_ids == spec.token_ids and len(plain.token_ids) == 24
    assert plain.tau == 1.0 and plain.num_target_forwards == 24
    out = capsys.readouterr().out
    assert "--- speculative (suffix) ---" in out and "--- plain ---" in out and "identical output: yes" in out


def test_four_concurrent_clients(draft_stack, reference):
    prompts = [[7, 8, 9, i] for i in range(4)]
    results: dict[int, list[int]] = {}

    def worker(i):
        with Client(draft_stack.address) as client:
            results[i] = client.generate(prompts[i], GREEDY, timeout_s=120).token_ids

    with Client(draft_stack.address) as client:  # batching figures of the target worker, before
        before = client.server_info().targets[0].info
    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    for i, prompt in enumerate(prompts):
        assert results[i] == reference("draft", prompt, GREEDY).token_ids
    with Client(draft_stack.address) as client:
        after = client.server_info().targets[0].info
    steps = after.num_sequence_steps - before.num_sequence_steps
    forwards = after.num_verify_forwards - before.num_verify_forwards
    assert steps > forwards > 0, (steps, forwards)  # some forwards verified several of the four at once
    assert 2 <= after.max_batch_seen <= after.max_batch == 8


SAMPLED_PROMPT = [5, 17, 99, 3]  # the noisy draft's q differs enough from p here that rejections matter
SAMPLED = SamplingParams(temperature=1.5, top_k=6, max_new_tokens=3, ignore_eos=True)
NUM_SAMPLED = 300


def test_async_client_and_sampling(drafting_stack, tiny_models):
    """Sampled over the wire (router -> draft worker -> target, 4 requests at a time, fixed seeds): the
    first two tokens follow the target's exact joint distribution (G-test); streaming stays whole."""
    async def go():
        async with AsyncClient(drafting_stack.address) as client:
            gate = asyncio.Semaphore(4)

            async def one(seed: int):
                async with gate:
                    return await client.generate(SAMPLED_PROMPT, dataclasses.replace(SAMPLED, seed=seed), timeout_s=60)

            outs = await asyncio.gather(*[one(seed) for seed in range(NUM_SAMPLED)])
            chunks = [c async for c in client.stream([4, 5, 6], GREEDY, timeout_s=60)]
            return outs, chunks
    outs, chunks = asyncio.run(go())
    assert all(len(out.token_ids) == 3 for out in outs)
    accepted, drafted = sum(o.stats.num_accepted_tokens for o in outs), sum(o.stats.num_draft_tokens for o in outs)
    assert all(o.stats.num_draft_tokens >= 2 for o in outs)  # every first step verified a draft
    assert 0 < accepted < drafted  # drafts were accepted and rejected along the way
    exact = exact_joint(target_next_probs(tiny_models["target"], SAMPLED), SAMPLED_PROMPT)
    assert_follows([tuple(out.token_ids[:2]) for out in outs], exact)
    assert chunks[-1].output.token_ids == [t for c in chunks for t in c.token_ids]


def _held(client: Client) -> tuple[list[str], list[str]]:
    info = client.server_info()
    return list(info.targets[0].info.sequence_ids), list(info.drafts[0].info.sequence_ids)


def _wait_released(client: Client, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while _held(client) != ([], []):
        assert time.monotonic() < deadline, f"sequences still held: {_held(client)}"
        time.sleep(0.1)


def test_cancel_releases_at_both_workers(draft_stack):
    with Client(draft_stack.address) as client:
        _wait_released(client)
        stream = client.stream([3, 1, 4, 1, 5], SamplingParams(max_new_tokens=900, ignore_eos=True), timeout_s=60)
        next(stream)
        targets, drafts = _held(client)
        assert len(targets) == 1 and drafts == targets  # held at both while running
        stream.close()  # cancels the call
        _wait_released(client)


def test_deadline_exceeded_releases(draft_stack):
    with Client(draft_stack.address) as client:
        _wait_released(client)
        with pytest.raises(DeadlineExceeded):
            client.generate([2, 7, 1, 8], SamplingParams(max_new_tokens=900, ignore_eos=True), timeout_s=0.3)
        _wait_released(client)


@pytest.mark.parametrize("prompt,params,message", [
    ("", SamplingParams(), "prompt is empty"),
    ([1, 2, 10**9], SamplingParams(), "outside the vocabulary"),
    ([1, 2, 3], SamplingParams(max_new_tokens=5000), "exceeds the model's context"),
])
def test_invalid_argument(draft_stack, prompt, params, message):
    with Client(draft_stack.address) as client, pytest.raises(InvalidArgument, match=message):
        client.generate(prompt, params, timeout_s=30)


@pytest.mark.parametrize("temperature", [-1.0, 1e-40, float("inf")])
def test_invalid_sampling_params_on_the_wire(draft_stack, temperature):
    """1e-40 overflowed logits / T to inf in the target's float32 warp (NaN fails the batch): refused at the door."""
    from specdec.rpc.v1 import generation_pb2, generation_pb2_grpc

    with grpc.insecure_channel(draft_stack.address) as channel:
        request = generation_pb2.GenerateRequest(text="hi")
        request.params.temperature = temperature
        request.params.max_new_tokens = 4
        with pytest.raises(grpc.RpcError) as err:
            list(generation_pb2_grpc.GenerationStub(channel).Generate(request, timeout=30))
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "temperature must be 0 (greedy) or in [0.01, 100]" in err.value.details()


def test_bounded_queue(draft_stack):
    """A second router on the same workers with one slot and no queue: the 2nd request is refused."""
    config = RouterConfig(targets=(draft_stack.targets[0].address,), drafts=(draft_stack.drafts[0].address,),
                          max_active=1, max_queue=0)
    with running("router", config) as router, Client(router.address) as client:
        stream = client.stream([9, 9, 9], SamplingParams(max_new_tokens=900, ignore_eos=True), timeout_s=60)
        next(stream)
        with pytest.raises(ResourceExhausted, match="busy"):
            client.generate([1, 2, 3], GREEDY, timeout_s=30)
        stream.close()


def test_health_and_reflection_on_every_server(draft_stack):
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    for process in [draft_stack.router, *draft_stack.targets, *draft_stack.drafts]:
        with grpc.insecure_channel(process.address) as channel:
            status = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert status.status == health_pb2.HealthCheckResponse.SERVING
            request = reflection_pb2.ServerReflectionRequest(list_services="")
            response = next(reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                iter([request]), timeout=10))
            names = {s.name for s in response.list_services_response.service}
            assert names & {"specdec.v1.Generation", "specdec.v1.TargetWorker", "specdec.v1.DraftWorker"}
