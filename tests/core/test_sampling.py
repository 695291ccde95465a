import pytest
import torch

from specdec.core.sampling import make_generator, sample, warp
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
