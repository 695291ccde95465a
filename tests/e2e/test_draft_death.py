"""A draft worker that dies (SIGKILL) costs no request a stall of more than one `draft_wait_s`: the
target stops waiting for a worker whose stream it lost, a sequence promised a drafter that never
connects is waited for once, and the router checks a benched draft worker before promising it
again, so requests after its back-off do not wait at all. Every output stays the greedy one."""
from __future__ import annotations

import time

import pytest

from e2e.harness import running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams

pytestmark = pytest.mark.e2e
DRAFT_WAIT_S = 2.0  # the target's default
BENCH_S = 5.0  # the router's back-off of a failed worker (router.pool.WorkerPool)
PARAMS = SamplingParams(max_new_tokens=48, ignore_eos=True)
PROMPTS = [[11, 22, 33, 44, 11, 22], [5, 6, 7, 8, 5, 6], [9, 10, 11, 9, 10], [40, 41, 42, 40, 41]]


def timed_stream(client, prompt, params, on_chunk=None) -> tuple[list[int], float]:
    """(tokens, the longest wait for a chunk, the first one included)."""
    tokens, longest, last = [], 0.0, time.monotonic()
    for chunk in client.stream(prompt, params, timeout_s=60):
        now = time.monotonic()
        longest, last = max(longest, now - last), now
        tokens += chunk.token_ids
        if on_chunk is not None:
            on_chunk(tokens)
    return tokens, longest


def test_a_dead_draft_worker_stalls_nobody_beyond_one_draft_wait(tiny_models, reference):
    long_params = SamplingParams(max_new_tokens=300, ignore_eos=True)
    with running_stack(stack_config(tiny_models, "draft", draft_wait_s=DRAFT_WAIT_S)) as stack, \
            Client(stack.address) as client:
        killed = []

        def kill_at_20(tokens):
            if not killed and len(tokens) >= 20:
                stack.drafts[0].kill()
                killed.append(time.monotonic())

        running, running_gap = timed_stream(client, PROMPTS[0], long_params, kill_at_20)
        assert killed and len(running) == 300
        # the router learns of the death here, when the draft worker does not take the sequence
        after_kill = timed_stream(client, PROMPTS[1], PARAMS)
        time.sleep(BENCH_S + 0.5)  # its back-off is over: the router may try the dead worker again
        after_bench = [timed_stream(client, prompt, PARAMS) for prompt in PROMPTS[2:]]
    assert running == reference("draft", PROMPTS[0], long_params).token_ids
    for prompt, (tokens, _) in zip(PROMPTS[1:], [after_kill, *after_bench]):
        assert tokens == reference("draft", prompt, PARAMS).token_ids
    gaps = {"running": running_gap, "after kill": after_kill[1], "after back-off": [g for _, g in after_bench]}
    # the one sequence promised the dead worker before anyone knew it was dead waits once, at most
    assert after_kill[1] < DRAFT_WAIT_S + 0.5, gaps
    # a running sequence does not wait for a worker whose stream is gone, nor does a request after the
    # back-off (the router checks the worker before promising it)
    assert running_gap < DRAFT_WAIT_S / 2 and max(gaps["after back-off"]) < DRAFT_WAIT_S / 2, gaps
