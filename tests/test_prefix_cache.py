"""Prompt-prefix caching: restored entries are bitwise a fresh prefill's, outputs are unchanged, the
cache stays within its bytes."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.errors import InvalidArgument
from specdec.kernels.attention import MAX_ROWS
from specdec.models.loader import load_model
from specdec.models.prefix_cache import BLOCK_TOKENS
from specdec.models.runner import ModelRunner, RunnerConfig
from specdec.sequence import Sequence

OPENING = list(range(3, 43))  # 40 shared tokens
TAILS = ([50, 51, 52, 53, 54], [60, 61], list(range(44, 84)))
GREEDY = SamplingParams(max_new_tokens=24, ignore_eos=True)
pytestmark = pytest.mark.usefixtures("one_thread")


def runners(path: str, dtype: torch.dtype) -> tuple[ModelRunner, ModelRunner]:
    model = load_model(path, dtype).model
    return (ModelRunner(model, config=RunnerConfig(prefix_cache_mb=8)),
            ModelRunner(model, config=RunnerConfig(prefix_cache_mb=0)))


def assert_prefills_alike(cached: ModelRunner, fresh: ModelRunner, prompt: list[int], chunk: int | None) -> None:
    """The prompt prefilled on `cached` (its opening restored where the prefix cache holds it, the rest in
    chunks of `chunk` tokens) holds bitwise the entries and last hidden state of one prefill on `fresh`."""
    got = Sequence(cached, prompt, GREEDY, prefill=False)
    while not got.prefilled:
        got.prefill_chunk(chunk)
    want = Sequence(fresh, prompt, GREEDY)
    n = len(prompt) - 1
    assert got.cache.length == want.cache.length == n
    same_entries = torch.equal(got.cache.store[..., :n, :], want.cache.store[..., :n, :])
    same_hidden = torch.equal(got.hidden, want.hidden)
    assert same_entries and same_hidden, f"entries equal: {same_entries}, last hidden state equal: {same_hidden}"


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 7])
def test_restored_entries_are_a_fresh_prefills_bitwise(tiny_target, dtype, chunk):
    cached, fresh = runners(tiny_target, dtype)
    for tail in TAILS:
        assert_prefills_alike(cached, fresh, OPENING + tail, chunk)
    prefixes = cached.prefix_cache
    assert prefixes.num_hit_tokens == 2 * (len(OPENING) // BLOCK_TOKENS * BLOCK_TOKENS)  # the second and third
                                                                                       # prompts found the opening
    assert fresh.prefix_cache is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("chunk", [None, 7, 256])
def test_a_prompt_longer_than_the_attention_kernel_takes_restores_bitwise(tiny_target, dtype, chunk):
    """A prompt past the attention kernel's rows per call (attention.MAX_ROWS) is prefilled in calls it takes,
    so its keys and values do not depend on where prefill chunks or the restored opening cut it (sdpa's
    rows depend on the call's shape: a long prompt's entries once differed with the opening restored, and
    plain decoding of one prompt differed from itself)."""
    cached, fresh = runners(tiny_target, dtype)
    assert cached.attention_kernel
    tail = [44 + (7 * i) % 40 for i in range(2 * MAX_ROWS + 30)]
    for _ in range(2):  # the second time the opening is restored
        assert_prefills_alike(cached, fresh, OPENING + tail, chunk)
    assert cached.prefix_cache.num_hit_tokens > 0


def test_generations_equal_with_and_without_the_cache(smol_path):
    """SmolLM2 with its chat template (a shared system turn), plain and self-drafting (Medusa reads the
    last prefilled position's hidden state): every output equals the uncached engine's."""
    prompts = ["Name a colour.", "Name a fruit.", "Name a colour.", "Write a haiku about rain."]
    for drafter in ("none", "medusa"):
        with_cache = Engine.from_pretrained(drafter=drafter, prefix_cache_mb=16)
        without = Engine.from_pretrained(drafter=drafter, prefix_cache_mb=0)
        for prompt in prompts:
            assert with_cache.generate(prompt, GREEDY, chat=True).token_ids == \
                without.generate(prompt, GREEDY, chat=True).token_ids
        assert with_cache.runner.prefix_cache.num_hit_tokens >= 2 * BLOCK_TOKENS * (len(prompts) - 1)


def test_sampled_generations_draw_alike_with_and_without_the_cache(tiny_target):
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_new_tokens=20, ignore_eos=True)
    # Fixed draft sizes: prompt lookup's trees are otherwise cut by measured step costs (scored nodes), and
    # a sampled step's draws follow its tree, so two engines' timings alone could part their outputs.
    with_cache = Engine.from_pretrained(target=tiny_target, drafter="ngram", prefix_cache_mb=4, adaptive=False)
    without = Engine.from_pretrained(target=tiny_target, drafter="ngram", prefix_cache_mb=0, adaptive=False)
    for tail in TAILS:
        assert with_cache.generate(OPENING + tail, params).token_ids == \
            without.generate(OPENING + tail, params).token_ids


def test_the_cache_keeps_within_its_bytes_and_drops_unreachable_blocks(tiny_target):
    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(prefix_cache_mb=1))
    prompts = [[first + 3] + list(range(20, 70)) for first in range(5)]  # several blocks each, no opening shared
    for prompt in prompts:
        Sequence(runner, prompt, GREEDY)
    prefixes = runner.prefix_cache
    blocks_each = (len(prompts[0]) - 1) // BLOCK_TOKENS
    assert len(prefixes.blocks) == 5 * blocks_each and prefixes.num_bytes <= prefixes.max_bytes
    block_bytes = next(iter(prefixes.blocks.values())).entries.nbytes
    prefixes.max_bytes = 4 * block_bytes
    prefixes._evict()
    assert prefixes.num_bytes <= 4 * block_bytes
    # every kept block is reachable from its prompt's first block: lookups find all that is held
    reachable = sum(len(prefixes.held(p, len(p))) for p in prompts)
    assert reachable == len(prefixes.blocks) >= 1
    assert sum(len(kids) for kids in prefixes.children.values()) == len(prefixes.blocks)


def test_a_shared_opening_outlives_the_tails_it_leads_to(tiny_target):
    """Full, the cache drops the least recently used tail blocks, never the opening every prompt uses."""
    runner = ModelRunner(load_model(tiny_target, torch.float32).model, config=RunnerConfig(prefix_cache_mb=1))
    opening = list(range(3, 3 + 2 * BLOCK_TOKENS))
    Sequence(runner, opening + [90], GREEDY)
    prefixes = runner.prefix_cache
    block_bytes = next(iter(prefixes.blocks.values())).entries.nbytes
    prefixes.max_bytes = 5 * block_bytes  # the opening's two blocks and three more
    for first in range(6):  # six prompts, each the opening and two blocks of its own
        Sequence(runner, opening + [40 + first] * (2 * BLOCK_TOKENS) + [90], GREEDY)
        assert len(prefixes.held(opening, len(opening))) == 2  # both opening blocks still there
        assert prefixes.num_bytes <= prefixes.max_bytes
    prefixes.max_bytes = 3 * block_bytes  # less than one prompt's four blocks: its tail goes, not its opening
    Sequence(runner, opening + [77] * (2 * BLOCK_TOKENS) + [90], GREEDY)
    assert len(prefixes.held(opening, len(opening))) == 2 and len(prefixes.blocks) == 3


def test_a_bad_budget_is_refused():
    with pytest.raises(InvalidArgument, match="prefix_cache_mb must be an integer >= 0"):
        RunnerConfig(prefix_cache_mb=-1)
