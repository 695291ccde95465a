"""A generation resumed from its committed tokens (what router failover asks of a second target) goes
on exactly as it would have: the same tokens greedy, the same draws when seeded (the random state of
a step depends only on the seed and the committed length), and the same text, with a stop string or a
character that straddles the switch coming out whole and nothing emitted twice."""
from __future__ import annotations

from pathlib import Path

import pytest

from specdec.batch_cache import BatchCache
from specdec.core.sampling import step_seed
from specdec.core.types import SamplingParams
from specdec.engine import Engine
from specdec.sequence import Sequence
from specdec.step import Drafting, decode_step

PROMPT = [5, 17, 42, 8, 5, 17, 42, 8, 5, 17]


def steps_of(engine: Engine, prompt, params) -> list[tuple[list[int], str]]:
    """The undisturbed generation, one (token ids, text) per step, as a target would commit them."""
    return [(e.token_ids, e.text) for e in engine.stream(prompt, params)]


def resume(engine: Engine, prompt, params, resumed: list[int]) -> tuple[list[int], str]:
    """A fresh sequence opened with `resumed` already generated, decoded to its end: (new ids, new text)."""
    session = engine.drafter.new_session() if engine.drafter is not None else None
    seq = Sequence(engine.runner, engine.encode(prompt), params, engine.tokenizer, engine.eos_ids,
                   resumed_ids=resumed)
    policy = engine.new_policy(load_aware=False)
    policy.add("0")
    entry, pool, ids, text = Drafting("0", seq, session), BatchCache(engine.runner), [], ""
    while seq.finish_reason is None:
        _, (step,), _ = decode_step(engine.runner, policy, pool, [entry], engine.max_len)
        ids, text = ids + step.token_ids, text + step.text
    return ids, text


def check_every_switch(engine: Engine, prompt, params, at: list[int]) -> None:
    steps = steps_of(engine, prompt, params)
    tokens = [t for ids, _ in steps for t in ids]
    text = "".join(t for _, t in steps)
    for k in at:  # resumed after k steps were streamed
        sent_ids = [t for ids, _ in steps[:k] for t in ids]
        sent_text = "".join(t for _, t in steps[:k])
        ids, more = resume(engine, prompt, params, sent_ids)
        assert sent_ids + ids == tokens, k
        assert sent_text + more == text, k


def test_greedy_resumes_token_for_token(tiny_target, one_thread):
    engine = Engine.from_pretrained(target=tiny_target, dtype="float32")
    check_every_switch(engine, PROMPT, SamplingParams(max_new_tokens=40, ignore_eos=True), [1, 2, 13, 39])


def test_seeded_sampling_resumes_with_the_same_draws(tiny_target, one_thread):
    engine = Engine.from_pretrained(target=tiny_target, dtype="float32")
    params = SamplingParams(temperature=1.0, top_k=20, seed=11, max_new_tokens=40, ignore_eos=True)
    check_every_switch(engine, PROMPT, params, [1, 7, 30])


def test_seeded_sampling_with_fixed_in_target_drafts_resumes_alike(tiny_target, tiny_noisy_draft, one_thread):
    """Drafting consumes draws too; with the same drafts (an in-target draft model at a fixed depth)
    the resumed sequence still draws what the first one would have."""
    engine = Engine.from_pretrained(target=tiny_target, dtype="float32", drafter="draft", draft=tiny_noisy_draft,
                                    adaptive=False, num_speculative_tokens=3)
    params = SamplingParams(temperature=0.8, seed=5, max_new_tokens=40, ignore_eos=True)
    steps = steps_of(engine, PROMPT, params)
    assert len(steps) < 30  # drafts were accepted: steps of several tokens
    check_every_switch(engine, PROMPT, params, [1, len(steps) // 2, len(steps) - 1])


@pytest.fixture(scope="module")
def worded_engine(tmp_path_factory):
    """A tiny random model with the SmolLM2 tokenizer: real text, stop strings and multi-byte characters."""
    from e2e.tiny import make_tiny_llama
    from specdec.models.embedded import embedded_target_path

    path = make_tiny_llama(Path(tmp_path_factory.mktemp("worded")) / "m", seed=4, tokenizer_dir=embedded_target_path())
    return Engine.from_pretrained(target=str(path), dtype="float32")


def test_text_and_stop_strings_straddling_the_switch(worded_engine, one_thread):
    engine = worded_engine
    free = SamplingParams(max_new_tokens=48, ignore_eos=True)
    check_every_switch(engine, PROMPT, free, [1, 10, 30, 47])
    steps = steps_of(engine, PROMPT, free)
    text = "".join(t for _, t in steps)
    cut = len("".join(t for _, t in steps[:30]))
    stop = next(text[i:cut + 3] for i in range(cut - 3, cut) if text.find(text[i:cut + 3]) == i)
    stopped = SamplingParams(max_new_tokens=48, ignore_eos=True, stop=(stop,))
    out = engine.generate(PROMPT, stopped)
    assert out.finish_reason == "stop" and out.text == text[:text.find(stop)]
    num_steps = len(steps_of(engine, PROMPT, stopped))
    check_every_switch(engine, PROMPT, stopped, list(range(max(num_steps - 5, 1), num_steps)))


def test_step_seeds_differ_per_position_and_seed():
    seeds = {step_seed(seed, position) for seed in range(50) for position in range(200)}
    assert len(seeds) == 50 * 200 and all(0 <= s < 2 ** 64 for s in seeds)
