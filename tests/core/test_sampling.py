from collections import Counter

import pytest
import torch

from distribution import g_test_kl
from specdec.core.sampling import _nucleus_head, greedy_ids, make_generator, sample, warp
from specdec.core.types import MAX_TEMPERATURE, MIN_TEMPERATURE, SamplingParams
from specdec.errors import InvalidArgument


def test_temperature_only_is_softmax():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    probs = warp(logits, SamplingParams(temperature=0.5))
    assert torch.allclose(probs, torch.softmax(logits / 0.5, dim=-1))


def test_top_k_keeps_k_largest():
    logits = torch.tensor([0.1, 3.0, 2.0, -1.0, 2.5])
    probs = warp(logits, SamplingParams(temperature=1.0, top_k=2))
    assert set(torch.nonzero(probs).flatten().tolist()) == {1, 4}
    assert probs.sum().item() == pytest.approx(1.0)


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs_in = torch.tensor([0.5, 0.3, 0.15, 0.05])
    logits = probs_in.log()
    kept = lambda p: set(torch.nonzero(warp(logits, SamplingParams(temperature=1.0, top_p=p))).flatten().tolist())
    assert kept(0.5) == {0}
    assert kept(0.6) == {0, 1}
    assert kept(0.81) == {0, 1, 2}
    assert kept(1.0) == {0, 1, 2, 3}


def test_seeded_generator_reproduces():
    probs = torch.full((50,), 1 / 50)
    a = [sample(probs, g) for g in [make_generator(7)] for _ in range(20)]
    b = [sample(probs, g) for g in [make_generator(7)] for _ in range(20)]
    assert a == b


@pytest.mark.parametrize("kwargs, word", [
    ({"temperature": -0.1}, "temperature"), ({"top_p": 0.0}, "top_p"), ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"), ({"max_new_tokens": 0}, "max_new_tokens"), ({"seed": -3}, "seed"),
])
def test_bad_params_name_the_problem(kwargs, word):
    with pytest.raises(InvalidArgument, match=word):
        SamplingParams(**kwargs)


@pytest.mark.parametrize("temperature", [1e-30, 1e-40, 0.009, 100.5, float("inf"), float("nan"), -1.0])
def test_temperature_outside_the_stated_range_is_refused(temperature):
    """Tiny temperatures overflow logits / T to inf (NaN probabilities that would fail a whole batch)."""
    with pytest.raises(InvalidArgument, match=r"temperature must be 0 \(greedy\) or in \[0.01, 100\]"):
        SamplingParams(temperature=temperature)


@pytest.mark.parametrize("temperature", [MIN_TEMPERATURE, 0.5, MAX_TEMPERATURE])
def test_every_accepted_temperature_warps_to_a_distribution(temperature):
    logits = torch.randn(4, 300, generator=torch.Generator().manual_seed(0)) * 30  # wide logits
    for params in (SamplingParams(temperature=temperature), SamplingParams(temperature=temperature, top_p=0.9),
                   SamplingParams(temperature=temperature, top_k=5)):
        probs = warp(logits, params)
        assert bool(torch.isfinite(probs).all()) and torch.allclose(probs.sum(-1), torch.ones(4))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_ids_pick_as_argmax_does_through_ties_and_nans(dtype):
    """greedy_ids must be argmax exactly: the first of tied maxima, and a NaN as the maximum."""
    gen = torch.Generator().manual_seed(0)
    for rows in (1, 3, 16):
        logits = torch.randint(-2, 3, (rows, 49152), generator=gen).to(dtype)  # every row full of ties
        logits[0, 7] = float("nan")
        logits[-1, -1] = 5.0  # a lone maximum at the very end
        assert torch.equal(greedy_ids(logits), logits.argmax(dim=-1))
        assert greedy_ids(logits)[0] == 7


def _nucleus(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """The tokens top-p keeps, as a mask [..., vocab]."""
    _, order, keep = _nucleus_head(probs, top_p)
    return torch.zeros_like(probs, dtype=torch.bool).scatter(-1, order, keep)


def test_nucleus_keeps_what_a_full_sort_keeps_row_by_row():
    """The top-p cut from the most probable k tokens (k grown until the mass is reached) equals the cut
    from sorting every probability, for peaked rows (k = 64 suffices) and flat ones (k grows to the whole
    vocabulary), and a row's cut does not depend on the rows beside it."""
    gen = torch.Generator().manual_seed(1)
    scales = torch.tensor([0.3, 3.0, 10.0, 1.0])[:, None]  # flat, middling, peaked, flat
    probs = (torch.randn(4, 49152, generator=gen) * scales).softmax(dim=-1)
    for top_p in (0.5, 0.9, 0.99):
        ordered, order = torch.sort(probs, dim=-1, descending=True)
        keep_sorted = ordered.cumsum(dim=-1) - ordered < top_p
        expected = torch.zeros_like(keep_sorted).scatter(-1, order, keep_sorted)
        together = _nucleus(probs, top_p)
        assert torch.equal(together, expected)
        for row in range(4):
            assert torch.equal(_nucleus(probs[row:row + 1], top_p), together[row:row + 1])
        assert together.sum(-1).min() >= 1


def test_sample_follows_its_distribution_and_never_draws_a_zero():
    """The inverse-running-sum draw: G-test against the distribution (unnormalised, with zeros at both
    ends and inside), and the zero-probability tokens are never drawn."""
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.5, 0.0])  # sums to 7, not 1
    generator = make_generator(3)
    draws = [sample(weights, generator) for _ in range(20000)]
    assert {t for t in draws if weights[t] == 0} == set()
    exact = {(t,): float(w / weights.sum()) for t, w in enumerate(weights) if w > 0}
    kl, tolerance = g_test_kl(Counter((t,) for t in draws), exact, len(draws))
    assert kl <= tolerance


def test_a_row_warps_alone_as_among_others():
    """WarpedRows warps rows one at a time: each must be bitwise the row of warping them all at once."""
    from specdec.core.sampling import WarpedRows

    logits = torch.randn(6, 49152, generator=torch.Generator().manual_seed(2)) * torch.tensor(
        [0.5, 2.0, 5.0, 8.0, 1.0, 12.0])[:, None]
    for params in (SamplingParams(temperature=0.7), SamplingParams(temperature=0.7, top_p=0.9),
                   SamplingParams(temperature=1.0, top_k=40, top_p=0.95)):
        together, lazy = warp(logits, params), WarpedRows(logits, params)
        for row in (3, 0, 5, 1, 4, 2):
            assert torch.equal(lazy[row], together[row])
        assert torch.allclose(together.sum(-1), torch.ones(6))
