import pytest
import torch

from specdec.core.sampling import make_generator, sample, warp
from specdec.core.types import SamplingParams
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
