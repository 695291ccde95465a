"""End-to-end statistical losslessness: the engine's first two sampled tokens vs the target's exact
joint distribution, with a real draft model drafting chains and trees (G-test as in
tests/core/test_verify_lossless.py, which also shows broken samplers failing it)."""
from __future__ import annotations

import pytest

from distribution import exact_joint, g_test_kl, target_next_probs
from specdec import Engine, SamplingParams

pytestmark = pytest.mark.usefixtures("one_thread")
PROMPT = [3, 1, 4, 1, 5, 9, 2, 6]
NUM_DRAWS = 2000


@pytest.mark.parametrize("options, params", [
    (dict(num_speculative_tokens=3), SamplingParams(temperature=1.0, top_k=20)),
    (dict(num_speculative_tokens=2, tree_width=2), SamplingParams(temperature=0.9, top_p=0.9)),
])
def test_sampled_tokens_follow_target_distribution(tiny_target, tiny_noisy_draft, options, params):
    engine = Engine.from_pretrained(target=tiny_target, drafter="draft", draft=tiny_noisy_draft, adaptive=False, **options)
    counts: dict = {}
    accepted = num_drafted = 0
    for seed in range(NUM_DRAWS):
        run = SamplingParams(temperature=params.temperature, top_k=params.top_k, top_p=params.top_p, seed=seed,
                             max_new_tokens=4, ignore_eos=True)
        out = engine.generate(PROMPT, run)
        key = tuple(out.token_ids[:2])
        counts[key] = counts.get(key, 0) + 1
        accepted += out.stats.num_accepted_tokens
        num_drafted += out.stats.num_draft_tokens
    # Drafts really were accepted, and rejected, along the way.
    assert NUM_DRAWS // 2 < accepted < 0.9 * num_drafted
    kl, tolerance = g_test_kl(counts, exact_joint(target_next_probs(tiny_target, params), PROMPT), NUM_DRAWS)
    assert kl <= tolerance, f"KL {kl:.5f} > tolerance {tolerance:.5f}"
