"""Greedy equality on the embedded SmolLM2-135M-Instruct target, for every drafter (64 new tokens)."""
from __future__ import annotations

import pytest

from specdec import Engine, SamplingParams

PROMPTS = [
    'Repeat the following JSON exactly: {"name": "Ada", "age": 36, "city": "London"}',
    'Convert to JSON with keys name and age: name is Ada, age is 36. Output {"name": ..., "age": ...}.',
    "Write a Python function that returns the square of a number.",
]
PARAMS = SamplingParams(max_new_tokens=64)


@pytest.fixture(scope="module")
def plain(smol_path):
    return Engine.from_pretrained(target=smol_path)


@pytest.fixture(scope="module")
def reference(plain):
    return [plain.generate(p, PARAMS, chat=True) for p in PROMPTS]


@pytest.mark.parametrize("config", [
    dict(drafter="ngram"),
    dict(drafter="ngram", num_branches=1),
    dict(drafter="ngram", num_branches=3, min_ngram=2, num_nodes=24),
    dict(drafter="suffix"),
    dict(drafter="draft"),
    dict(drafter="draft", tree_width=2, num_speculative_tokens=3, adaptive=False),
], ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_equals_plain(smol_path, reference, config):
    engine = Engine.from_pretrained(target=smol_path, **config)
    for prompt, want in zip(PROMPTS, reference):
        out = engine.generate(prompt, PARAMS, chat=True)
        assert out.token_ids == want.token_ids
        assert out.text == want.text
        assert out.finish_reason == want.finish_reason


def test_plain_decoding_is_one_token_per_forward(reference):
    for out in reference:
        assert out.stats.tau == 1.0
        assert out.stats.num_target_forwards == len(out.token_ids)
        assert out.text.strip()


def test_prompt_lookup_accepts_on_copy_prompt(smol_path, reference):
    out = Engine.from_pretrained(target=smol_path, drafter="ngram").generate(PROMPTS[0], PARAMS, chat=True)
    assert out.token_ids == reference[0].token_ids
    assert out.stats.num_accepted_tokens > 0 and out.stats.tau > 1.0


def test_prompt_lookup_drafts_past_eight_tokens_on_a_long_copy(smol_path, plain):
    """A long verbatim match is drafted (and accepted) deeper than the old fixed depth of 8, losslessly."""
    prompt = PROMPTS[0]  # the model repeats the JSON verbatim: 16 tokens in one step
    want = plain.generate(prompt, PARAMS, chat=True)
    out = Engine.from_pretrained(target=smol_path, drafter="ngram", adaptive=False).generate(prompt, PARAMS, chat=True)
    assert out.token_ids == want.token_ids
    assert len(out.stats.num_accepted_per_pos) > 8  # some step accepted a 9th draft token or more


def test_stop_string_and_streaming(plain, reference):
    want = reference[1].text
    stop = want[10:14]
    events = list(plain.stream(PROMPTS[1], SamplingParams(max_new_tokens=64, stop=(stop,)), chat=True))
    out = events[-1].output
    assert out.finish_reason == "stop"
    assert out.text == want[:want.index(stop)]
    assert "".join(e.text for e in events) == out.text
    assert [t for e in events for t in e.token_ids] == out.token_ids


def test_token_id_prompt_equals_text_prompt(plain, reference):
    ids = plain.encode(PROMPTS[2], chat=True)
    assert plain.generate(ids, PARAMS).token_ids == reference[2].token_ids


def test_batched_verification_equals_alone(smol_path, reference):
    from specdec.batch import generate_batch

    engine = Engine.from_pretrained(target=smol_path, drafter="ngram", num_branches=2)
    batched = generate_batch(engine, PROMPTS, PARAMS, max_batch=3, chat=True)
    assert batched == [want.token_ids for want in reference]
