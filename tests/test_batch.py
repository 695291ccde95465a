"""Batched verification: every sequence's greedy output equals decoding it alone."""
from __future__ import annotations

import pytest

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7], [40, 41], [11, 12, 13, 11, 12, 13, 11, 12, 13, 11, 12, 13, 14, 15],
           [1, 2, 3], [60, 61, 62, 63, 64, 60, 61], [7]]


@pytest.mark.parametrize("config", [dict(drafter="none"), dict(drafter="ngram", num_branches=2),
                                    dict(drafter="draft", tree_width=2, num_speculative_tokens=3)],
                         ids=lambda c: c["drafter"])
def test_batched_greedy_equals_alone(tiny_target, tiny_noisy_draft, config):
    engine = Engine.from_pretrained(target=tiny_target, draft=tiny_noisy_draft if config["drafter"] == "draft" else None,
                                    **config)
    lengths = [12, 30, 7, 25, 18, 3]  # sequences finish at different steps: the batch shrinks and refills
    alone = [engine.generate(p, SamplingParams(max_new_tokens=n, ignore_eos=True)).token_ids
             for p, n in zip(PROMPTS, lengths)]
    # Per-sequence max tokens through one params object is not possible, so compare prefixes of a long run.
    batched = generate_batch(engine, PROMPTS, SamplingParams(max_new_tokens=30, ignore_eos=True), max_batch=4)
    for want, got in zip(alone, batched):
        assert got[:len(want)] == want
        assert len(got) == 30
