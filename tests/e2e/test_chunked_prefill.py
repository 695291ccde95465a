"""Chunked prefill, end to end: an 8,000-token prompt arriving while another stream decodes is
prefilled a chunk at a time between that stream's steps, so the running stream never waits for the
whole prefill (its longest gap between tokens stays under 2 s; in one forward this model takes
several seconds for the prompt), and both outputs are still the in-process greedy ones."""
from __future__ import annotations

import threading
import time

import pytest

from e2e.harness import running_stack
from e2e.tiny import make_tiny_llama
from specdec.client import Client
from specdec.core.types import SamplingParams
from specdec.serving_config import RouterConfig, StackConfig, TargetConfig

pytestmark = pytest.mark.e2e
LONG_PROMPT = [(i * 37 + 11) % 509 + 3 for i in range(8000)]
LONG_PARAMS = SamplingParams(max_new_tokens=8, ignore_eos=True)
RUNNING_PROMPT = [5, 6, 7, 8]
RUNNING_PARAMS = SamplingParams(max_new_tokens=4000, ignore_eos=True)


@pytest.fixture(scope="module")
def long_model(tmp_path_factory):
    """Big enough that one 8,000-token forward takes seconds on this CPU, small enough to decode fast."""
    return make_tiny_llama(tmp_path_factory.mktemp("long") / "target", seed=3, num_layers=4, hidden_size=128,
                           max_positions=8192)


def test_a_long_prompt_does_not_stall_a_running_stream(long_model):
    target = TargetConfig(model=str(long_model), dtype="float32", num_threads=1, prefill_chunk_tokens=128)
    config = StackConfig(router=RouterConfig(max_active=4, max_queue=4), targets=(target,), drafts=(),
                         ready_timeout_s=120)
    long_result: dict = {}

    def send_long(client) -> None:
        out = client.generate(LONG_PROMPT, LONG_PARAMS, timeout_s=300)
        long_result.update(tokens=out.token_ids, done_at=time.monotonic())

    with running_stack(config) as stack, Client(stack.address) as client:
        running, arrivals, sender = [], [], None
        for chunk in client.stream(RUNNING_PROMPT, RUNNING_PARAMS, timeout_s=300):
            running += chunk.token_ids
            arrivals.append(time.monotonic())
            if sender is None and len(running) >= 20:
                sent_at = time.monotonic()
                sender = threading.Thread(target=send_long, args=(client,))
                sender.start()
            if "done_at" in long_result:
                break  # the long prompt went through prefill and decoding alongside: enough
        sender.join(timeout=300)
    window = [t for t in arrivals if sent_at - 1e-3 <= t <= long_result["done_at"]]  # from the token that sent it
    assert window[0] <= sent_at
    gaps = [b - a for a, b in zip(window, window[1:])]
    assert max(gaps) < 2.0, max(gaps)
    assert len(window) > 20, len(window)  # the running stream kept decoding while the prompt was prefilled

    from specdec.engine import Engine

    engine = Engine.from_pretrained(str(long_model), dtype="float32")
    assert long_result["tokens"] == engine.generate(LONG_PROMPT, LONG_PARAMS).token_ids
    expected = engine.generate(RUNNING_PROMPT, SamplingParams(max_new_tokens=len(running), ignore_eos=True))
    assert running == expected.token_ids
