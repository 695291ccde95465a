"""Turning logits into the distribution we sample from (temperature, top-k, top-p).

Target and drafter must warp with the same function: the lossless contract is stated against the
target's *warped* distribution p, and a drafter's q is whatever it really sampled from.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specdec.core.types import SamplingParams


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (params.temperature > 0).

    logits: [..., vocab] -> probs: [..., vocab] float32, each row sums to 1.
    """
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32)) / params.temperature  # float64 stays
    vocab_size = scores.shape[-1]
    if 0 < params.top_k < vocab_size:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, order = torch.sort(scores, dim=-1, descending=True)
        sorted_probs = sorted_scores.softmax(dim=-1)
        # Drop a token when the mass strictly before it already reaches top_p (the first always stays).
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        scores = scores.masked_fill(drop, float("-inf"))
    return scores.softmax(dim=-1)


@runtime_checkable
class Draws(Protocol):
    """A source of randomness other than a torch.Generator: every random choice of drafting and
    verification goes through `sample` and `accept` below, so a test can enumerate all outcomes
    with their exact probabilities through the real code."""

    def categorical(self, probs: torch.Tensor) -> int: ...

    def bernoulli(self, prob: float) -> bool: ...


def sample(probs: torch.Tensor, generator: torch.Generator | Draws | None) -> int:
    """One draw from probs [vocab]."""
    if isinstance(generator, Draws):
        return generator.categorical(probs)
    return int(torch.multinomial(probs, 1, generator=generator))


def accept(p_x: float, q_x: float, generator: torch.Generator | Draws | None) -> bool:
    """True with probability min(1, p_x / q_x) (q_x > 0): the rejection-sampling test."""
    if isinstance(generator, Draws):
        return generator.bernoulli(min(1.0, p_x / q_x))
    device = "cpu" if generator is None else generator.device
    return float(torch.rand((), generator=generator, device=device)) * q_x < p_x


MASK64 = (1 << 64) - 1


def step_seed(seed: int, position: int) -> int:
    """The seed of a seeded sequence's draws at one step: a function of the request's seed and the
    number of committed tokens (prompt included) only. So the random state of a step does not depend
    on how many draws earlier steps took, nor on which process made them: a generation resumed on
    another target (router failover) draws exactly what the first target would have drawn next.
    splitmix64 of the pair, so neighbouring positions get unrelated seeds."""
    z = (seed * 0x9E3779B97F4A7C15 + position + 0x632BE59BD9B4E019) & MASK64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return z ^ (z >> 31)


def make_generator(seed: int | None, device: torch.device | str = "cpu") -> torch.Generator:
    """A generator on the device whose distributions it samples (the model's): seeded for
    reproducible runs, otherwise from fresh entropy."""
    generator = torch.Generator(device=device)
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(seed)
    return generator
