"""`specdec serve` keeps its stack up (specdec.launch.Supervisor), end to end on 127.0.0.1: a SIGKILLed
target is restarted on its address and the router takes it back by itself, and so is a draft worker.
With one target, the stream its death cut short ends at once with a clean UNAVAILABLE that says so."""
from __future__ import annotations

import time

import pytest

from e2e.harness import running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.errors import SpecdecError, Unavailable

pytestmark = pytest.mark.e2e
LONG = SamplingParams(max_new_tokens=600, ignore_eos=True)
SHORT = SamplingParams(max_new_tokens=16, ignore_eos=True)
PROMPT = [5, 6, 7, 8, 5, 6]
BACK_WITHIN_S = 120.0  # a restart loads the model again: slow on a loaded 2-core machine


def wait_restarted(stack, group: str, old_pid: int) -> None:
    deadline = time.monotonic() + BACK_WITHIN_S
    while getattr(stack, group)[0].popen.pid == old_pid or not getattr(stack, group)[0].address:
        assert time.monotonic() < deadline, f"{group} not restarted"
        time.sleep(0.2)


def first_success(client, prompt, params):
    """The first request the router serves again (while it still has the worker benched it refuses)."""
    deadline = time.monotonic() + BACK_WITHIN_S
    while True:
        try:
            return client.generate(prompt, params, timeout_s=60)
        except SpecdecError:
            assert time.monotonic() < deadline, "the router did not take the restarted worker back"
            time.sleep(0.5)


def test_dead_workers_are_restarted_and_taken_back(tiny_models, reference):
    with running_stack(stack_config(tiny_models, "ngram"), supervise=True) as stack, \
            Client(stack.address) as client:
        target, address = stack.targets[0], stack.targets[0].address
        token_ids = []
        with pytest.raises(Unavailable) as lost:
            for chunk in client.stream(PROMPT, LONG, timeout_s=120):
                token_ids += chunk.token_ids
                if len(token_ids) >= 10 and target.popen.poll() is None:
                    target.kill()
                    killed_at = time.monotonic()
        refused_after_s = time.monotonic() - killed_at
        assert "no other target worker" in str(lost.value) and refused_after_s < 5.0, (lost.value, refused_after_s)
        assert 10 <= len(token_ids) < 600
        assert token_ids == reference("ngram", PROMPT, LONG).token_ids[:len(token_ids)]

        wait_restarted(stack, "targets", target.popen.pid)
        assert stack.targets[0].address == address  # same address: the router knows it by that
        assert first_success(client, PROMPT, SHORT).token_ids == reference("ngram", PROMPT, SHORT).token_ids
        info = client.server_info()
        assert info.targets[0].healthy and info.targets[0].info.num_served >= 1  # served by the new process

        draft = stack.drafts[0]
        draft.kill()
        wait_restarted(stack, "drafts", draft.popen.pid)
        assert stack.drafts[0].address == draft.address
        deadline = time.monotonic() + BACK_WITHIN_S
        while not client.server_info().drafts[0].info.num_served:  # the restarted draft worker drafts again
            assert time.monotonic() < deadline, "the router did not take the restarted draft worker back"
            out = client.generate(PROMPT, SHORT, timeout_s=60)
            assert out.token_ids == reference("ngram", PROMPT, SHORT).token_ids
            time.sleep(0.5)
        assert stack.supervisor.num_restarts == 2
