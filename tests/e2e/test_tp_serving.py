"""`specdec serve target --tp N`: a target worker split over N processes answers exactly like one process.

Greedy output through router -> ngram draft worker -> target worker at --tp 2 equals the in-process
engine at tp 1 token for token (batched verification included); so does SmolLM2 at --tp 3 (9 query /
3 key-value heads), and a seeded sampling request; sampled tokens at --tp 2 follow the target's exact
distribution. A degree that does not split the heads is refused
before any rank starts, and a dead rank stops the whole group.
"""
from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from distribution import assert_follows, exact_joint, target_next_probs
from e2e.harness import READY_TIMEOUT_S, running, running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.serving_config import RouterConfig, StackConfig, TargetConfig

pytestmark = pytest.mark.e2e
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)


@pytest.fixture(scope="module")
def tp2_stack(tiny_models):
    """The tiny target (4 query / 2 key-value heads) at --tp 2, an ngram draft worker, a router."""
    with running_stack(stack_config(tiny_models, "ngram", tp=2)) as stack:
        yield stack


def alone(target: TargetConfig) -> StackConfig:
    """A router and one target worker, no draft worker: the steps do not depend on draft timing."""
    return StackConfig(router=RouterConfig(max_active=4, max_queue=4), targets=(target,), drafts=(),
                       ready_timeout_s=READY_TIMEOUT_S)


def test_greedy_tp2_equals_tp1(tp2_stack, reference):
    prompts = ["The quick brown fox", [5, 17, 99, 3, 5, 17, 99, 3, 5, 17]]
    with Client(tp2_stack.address) as client:
        for prompt in prompts:
            assert client.generate(prompt, GREEDY, timeout_s=120).token_ids == \
                reference("ngram", prompt, GREEDY).token_ids
        info = client.server_info().targets[0].info
    assert info.tp_degree == 2


def test_concurrent_requests_are_batched_across_ranks(tp2_stack, reference):
    prompts = [[7, 8, 9, 7, 8, 9, i] for i in range(3)]
    results: dict[int, list[int]] = {}

    def call(i: int) -> None:
        with Client(tp2_stack.address) as client:
            results[i] = client.generate(prompts[i], GREEDY, timeout_s=120).token_ids

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(prompts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(150)
    for i, prompt in enumerate(prompts):
        assert results.get(i) == reference("ngram", prompt, GREEDY).token_ids
    with Client(tp2_stack.address) as client:
        info = client.server_info().targets[0].info
    assert info.max_batch_seen >= 2  # three sequences at once: some forwards verified several


@pytest.fixture(scope="module")
def tp2_self_drafting(tiny_models):
    """A router and the tiny target at --tp 2 drafting for itself with prompt lookup at a fixed depth (no
    draft worker, no adaptive or load-aware choice): the trees, and so the draws, do not depend on timing."""
    target = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, tp=2, drafter="ngram",
                          adaptive=False, load_aware=False)
    with running_stack(alone(target)) as stack:
        yield stack


def test_seeded_sampling_tp2_equals_tp1(tp2_self_drafting, tiny_models, one_thread):
    from specdec.engine import Engine

    params = SamplingParams(temperature=0.9, top_k=40, seed=1234, max_new_tokens=24, ignore_eos=True)
    prompt = "one two one two one two one"
    engine = Engine.from_pretrained(str(tiny_models["target"]), drafter="ngram", dtype="float32", adaptive=False)
    want = engine.generate(prompt, params).token_ids
    with Client(tp2_self_drafting.address) as client:
        assert client.generate(prompt, params, timeout_s=120).token_ids == want
        # Unseeded, rank 0's draws reach the followers too: a follower that drew differently would
        # commit other tokens, and the next step's check would stop the group (failing the greedy call).
        unseeded = SamplingParams(temperature=0.9, top_k=40, max_new_tokens=24, ignore_eos=True)
        assert len(client.generate(prompt, unseeded, timeout_s=120).token_ids) == 24
        assert client.generate(prompt, GREEDY, timeout_s=120).token_ids == engine.generate(prompt, GREEDY).token_ids


# Prompt lookup proposes 367, 3 (what followed the earlier 11, 1000); the tiny target gives 367 a
# probability of about 0.4 here, so the draft is accepted and rejected in comparable shares.
LOOKUP_PROMPT = [11, 1000, 367, 3, 11, 1000]
SAMPLED = SamplingParams(temperature=1.5, top_k=6, max_new_tokens=3, ignore_eos=True)
NUM_SAMPLED = 400


def test_sampling_at_tp2_follows_the_target(tp2_self_drafting, tiny_models):
    """Sampled through the router at --tp 2, 4 requests at a time, fixed seeds: the first two tokens follow
    the target's exact joint distribution (G-test, exact p from an unsplit float32 forward)."""
    from concurrent.futures import ThreadPoolExecutor

    with Client(tp2_self_drafting.address) as client, ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda seed: client.generate(LOOKUP_PROMPT, dataclasses.replace(SAMPLED, seed=seed),
                                                          timeout_s=120), range(NUM_SAMPLED)))
    accepted, drafted = sum(o.stats.num_accepted_tokens for o in outs), sum(o.stats.num_draft_tokens for o in outs)
    assert all(o.stats.num_draft_tokens > 0 for o in outs) and 0 < accepted < drafted
    exact = exact_joint(target_next_probs(tiny_models["target"], SAMPLED), LOOKUP_PROMPT)
    assert_follows([tuple(o.token_ids[:2]) for o in outs], exact)


def test_smollm2_tp3_equals_tp1(one_thread):
    """9 query / 3 key-value heads split 3 ways."""
    from specdec.engine import Engine

    params = SamplingParams(max_new_tokens=8)
    prompt = "Name three colours."
    want = Engine.from_pretrained(None, dtype="float32").generate(prompt, params, chat=True).token_ids
    with running_stack(alone(TargetConfig(dtype="float32", tp=3))) as stack, Client(stack.address) as client:
        assert client.generate(prompt, params, chat=True, timeout_s=120).token_ids == want


def test_degree_that_does_not_divide_heads_is_one_line_exit_2(smol_path):
    result = subprocess.run([sys.executable, "-m", "specdec.cli", "serve", "target", "--tp", "2"],
                            capture_output=True, text=True, timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "specdec: error: --tp 2 does not divide the model's 9 attention heads and 3 key-value heads; "
        "valid degrees: 1, 3"]
    assert "ready" not in result.stdout


def test_a_dead_rank_stops_the_group(tiny_models):
    """SIGKILL rank 0: the follower's next collective fails at once and the launcher stops everything."""
    config = TargetConfig(model=str(tiny_models["target"]), dtype="float32", num_threads=1, tp=2)
    with running("target", config) as launcher:
        ranks = _children(launcher.popen.pid)
        assert len(ranks) == 2
        rank0, = (pid for pid in ranks if b"\0RANK=0\0" in b"\0" + Path(f"/proc/{pid}/environ").read_bytes())
        os.kill(rank0, signal.SIGKILL)
        assert launcher.popen.wait(timeout=30) != 0
        deadline = time.monotonic() + 10
        while any(Path(f"/proc/{pid}").exists() and _state(pid) != "Z" for pid in ranks):
            assert time.monotonic() < deadline, "a rank outlived its group"
            time.sleep(0.1)


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"
