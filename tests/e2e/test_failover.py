"""Target failover, end to end on 127.0.0.1: a router with two targets continues a running generation
on the other target when its target is SIGKILLed mid-stream, from the tokens the client was already
sent, so the client's stream (tokens and text) is exactly the undisturbed greedy one: nothing lost,
nothing repeated (a draft worker drafts for it on both targets)."""
from __future__ import annotations

import dataclasses

import pytest

from e2e.harness import running_stack, stack_config
from specdec.client import Client
from specdec.core.types import SamplingParams

pytestmark = pytest.mark.e2e
PROMPT = [11, 22, 33, 44, 11, 22]
PARAMS = SamplingParams(max_new_tokens=600, ignore_eos=True)


def test_a_stream_survives_the_death_of_its_target(tiny_models, reference):
    expected = reference("draft", PROMPT, PARAMS)
    config = stack_config(tiny_models, "draft")
    config = dataclasses.replace(config, targets=config.targets * 2)
    with running_stack(config) as stack, Client(stack.address) as client:
        token_ids, texts, victim = [], [], None
        for chunk in client.stream(PROMPT, PARAMS, timeout_s=120):
            token_ids += chunk.token_ids
            texts.append(chunk.text)
            if victim is None and len(token_ids) >= 10:
                holders = [bool(t.info.sequence_ids) for t in client.server_info().targets]
                victim = holders.index(True)
                stack.targets[victim].kill()
        after = client.server_info()
        again = client.generate(PROMPT[:3], SamplingParams(max_new_tokens=16, ignore_eos=True), timeout_s=60)
    assert victim is not None and holders.count(True) == 1
    assert token_ids == expected.token_ids  # each token once, in order, across the switch
    assert chunk.output.token_ids == expected.token_ids and chunk.output.finish_reason == "length"
    assert "".join(texts) == chunk.output.text == expected.text
    survivor = after.targets[1 - victim]
    assert survivor.info.num_served == 1  # the generation finished there: it did fail over mid-stream
    assert not after.targets[victim].healthy
    # later requests go to the survivor at once
    assert again.token_ids == reference("draft", PROMPT[:3], SamplingParams(max_new_tokens=16, ignore_eos=True)).token_ids
