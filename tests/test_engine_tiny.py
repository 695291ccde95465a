"""Greedy equality with plain decoding on a tiny random target/draft pair (every drafter, chain and tree)."""
from __future__ import annotations

import pytest

from specdec import Engine, SamplingParams
from specdec.errors import InvalidArgument, ModelNotFound

# Repetitive prompts give prompt lookup something to find.
PROMPTS = [[5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7], [40, 41, 42, 43, 1, 2, 40, 41], [11, 12, 13]]
GREEDY = SamplingParams(max_new_tokens=40, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def reference(tiny_target):
    engine = Engine.from_pretrained(target=tiny_target)
    return [engine.generate(p, GREEDY).token_ids for p in PROMPTS]


CONFIGS = [
    dict(drafter="ngram"),
    dict(drafter="ngram", num_branches=3),
    dict(drafter="ngram", adaptive=False, num_speculative_tokens=5),
    dict(drafter="suffix"),
    dict(drafter="suffix", adaptive=False, num_speculative_tokens=6, min_token_prob=0.0),
    dict(drafter="draft"),
    dict(drafter="draft", tree_width=2, num_speculative_tokens=4),
    dict(drafter="draft", adaptive=False, num_speculative_tokens=3),
]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(f"{k}={v}" for k, v in c.items()))
def test_greedy_equals_plain_decoding(tiny_target, tiny_draft, reference, config):
    engine = Engine.from_pretrained(target=tiny_target, draft=tiny_draft if config["drafter"] == "draft" else None,
                                    **config)
    for prompt, want in zip(PROMPTS, reference):
        out = engine.generate(prompt, GREEDY)
        assert out.token_ids == want
        assert out.stats.num_new_tokens == len(want) == 40
        assert out.stats.num_target_forwards * out.stats.tau == pytest.approx(40)


@pytest.mark.parametrize("tree_width", [1, 3])
def test_draft_identical_to_target_accepts_everything(tiny_target, reference, tree_width):
    """The target as its own draft: every draft is accepted, so each step emits k + 1 tokens."""
    engine = Engine.from_pretrained(target=tiny_target, drafter="draft", draft=tiny_target, adaptive=False,
                                    num_speculative_tokens=4, tree_width=tree_width)
    out = engine.generate(PROMPTS[0], GREEDY)
    assert out.token_ids == reference[0]
    if tree_width == 1:
        assert out.stats.num_target_forwards == 8  # 40 tokens / (4 accepted + 1 bonus)
        assert out.stats.tau == pytest.approx(5.0)
    else:  # reranking by cumulative draft confidence may prune the greedy path now and then
        assert out.stats.tau > 3.0


def test_streamed_events_add_up_and_stop_at_max_tokens(tiny_target, reference):
    engine = Engine.from_pretrained(target=tiny_target, drafter="ngram")
    events = list(engine.stream(PROMPTS[0], SamplingParams(max_new_tokens=17, ignore_eos=True)))
    ids = [t for e in events for t in e.token_ids]
    assert ids == events[-1].output.token_ids == reference[0][:17]
    assert events[-1].output.finish_reason == "length"


def test_stops_at_eos(tiny_target, reference):
    engine = Engine.from_pretrained(target=tiny_target, drafter="ngram")
    eos = reference[0][10]
    engine.eos_ids = frozenset({eos})
    out = engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=40))
    first = reference[0].index(eos)
    assert out.token_ids == reference[0][:first + 1]
    assert out.finish_reason == "eos"


def test_seeded_sampling_is_reproducible_without_adaptation(tiny_target, tiny_draft):
    engine = Engine.from_pretrained(target=tiny_target, drafter="draft", draft=tiny_draft, adaptive=False)
    params = SamplingParams(temperature=0.9, top_p=0.95, seed=3, max_new_tokens=30, ignore_eos=True)
    assert engine.generate(PROMPTS[1], params).token_ids == engine.generate(PROMPTS[1], params).token_ids


def test_bad_input(tiny_target):
    engine = Engine.from_pretrained(target=tiny_target)
    with pytest.raises(InvalidArgument, match="empty"):
        engine.generate([])
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        engine.generate([1, 10_000])
    with pytest.raises(InvalidArgument, match="no tokenizer"):
        engine.generate("text needs a tokenizer")
    with pytest.raises(InvalidArgument, match="exceeds the model's context"):
        engine.generate([1, 2], SamplingParams(max_new_tokens=10_000))
    with pytest.raises(ModelNotFound, match="does not exist"):
        Engine.from_pretrained(target="/no/such/model")
    with pytest.raises(InvalidArgument, match="unknown drafter"):
        Engine.from_pretrained(target=tiny_target, drafter="magic")
    with pytest.raises(InvalidArgument, match="takes no option"):
        Engine.from_pretrained(target=tiny_target, drafter="ngram", tree_width=2)
