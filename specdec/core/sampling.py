"""Turning logits into the distribution we sample from (temperature, top-k, top-p).

Target and drafter must warp with the same function: the lossless contract is stated against the
target's *warped* distribution p, and a drafter's q is whatever it really sampled from.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable

import torch

from specdec.core.types import SamplingParams


def greedy_ids(logits: torch.Tensor) -> torch.Tensor:
    """logits [..., vocab] -> the greedy token per row [...]: argmax's answer (the first maximum; a NaN
    counts as the maximum), through max(dim).indices, which on a CPU reduces the 49,152-token vocabulary
    in a third of argmax's time (measured: 80 vs 244 us for 8 rows, float32, 2 threads). Every greedy
    pick of the engine goes through here, so plain and speculative decoding pick alike by construction."""
    return logits.max(dim=-1).indices


def warp(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Probabilities after temperature, top-k and top-p (params.temperature > 0).

    logits: [..., vocab] -> probs: [..., vocab] float32, each row sums to 1.
    """
    scores = logits.to(torch.promote_types(logits.dtype, torch.float32)) / params.temperature  # float64 stays
    vocab_size = scores.shape[-1]
    if 0 < params.top_k < vocab_size:
        kth = torch.topk(scores, params.top_k, dim=-1).values[..., -1:]  # [..., 1]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:  # the kept head renormalised, scattered back: no pass over the vocabulary's masks
        top, order, keep = _nucleus_head(scores.softmax(dim=-1), params.top_p)
        # the kept mass from the running sum (sequential, so the same for any k): a row's probabilities
        # do not depend on the rows warped with it
        mass = top.cumsum(dim=-1).gather(-1, keep.sum(dim=-1, keepdim=True) - 1)  # [..., 1]
        return torch.zeros_like(scores).scatter_(-1, order, top * keep / mass)
    return scores.softmax(dim=-1)


def _nucleus_head(probs: torch.Tensor, top_p: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """probs [..., vocab] -> (top [..., k] the k largest probabilities, order [..., k] their tokens,
    keep [..., k] bool): a token stays unless the mass of the more probable tokens before it already
    reaches top_p (the most probable always stays); every token outside the k is dropped.

    Only the head of the sorted order matters, so the most probable k tokens are taken (k = 64, then
    8x more while some row's k tokens hold less than top_p; the whole vocabulary at worst) instead of
    sorting all 49,152: a full sort took 2.7 ms for one row and 14 ms for 8 (float32, 2 threads), more
    than the forward. A row's answer does not depend on k nor on the other rows (a prefix of the sorted
    order and its running sum are the same in any longer one), so verify rows and plain rows agree.
    The masses are the row's softmax in vocabulary order; the sorted row's own softmax (the earlier
    form) rounds its sum in another order, so on flat rows the cut can fall one token apart (3 of 108
    random rows, none with peaked logits). Target and drafters warp through this one function, so
    the contract (p is warp's distribution) is unchanged."""
    vocab = probs.shape[-1]
    k = min(vocab, 64)
    while True:
        top, order = torch.topk(probs, k, dim=-1)  # [..., k] most probable first
        running = top.cumsum(dim=-1)
        if k == vocab or bool((running[..., -1] >= top_p).all()):
            break  # every token past the k-th has at least running[-1] >= top_p before it: dropped
        k = min(vocab, k * 8)
    return top, order, running - top < top_p


class WarpedRows:
    """logits [rows, vocab] warped row by row when first read (`rows[i]` -> probs [vocab]): sampled
    verification reads only the rows along its accepted path, ~1-2 of a tree's 5-16, and warping
    costs about a tenth of a millisecond a row. A row warps alone as it would among the others."""

    def __init__(self, logits: torch.Tensor, params: SamplingParams):
        self.logits, self.params, self.rows = logits, params, {}

    def __getitem__(self, row: int) -> torch.Tensor:
        if row not in self.rows:
            self.rows[row] = warp(self.logits[row:row + 1], self.params)[0]
        return self.rows[row]


@runtime_checkable
class Draws(Protocol):
    """A source of randomness other than a torch.Generator: every random choice of drafting and
    verification goes through `sample` and `accept` below, so a test can enumerate all outcomes
    with their exact probabilities through the real code."""

    def categorical(self, probs: torch.Tensor) -> int: ...

    def bernoulli(self, prob: float) -> bool: ...


def sample(probs: torch.Tensor, generator: torch.Generator | Draws | None) -> int:
    """One draw from probs [vocab] (non-negative, any positive sum), by the inverse of its running sum:
    token i is drawn when a uniform u in [0, sum) falls in [cdf[i-1], cdf[i]), so with probability
    probs[i] / sum, and a zero-probability token never (its interval is empty). One uniform and a
    float64 running sum: 45 us over 49,152 tokens where torch.multinomial took 890 us (CPU, 2 threads),
    which had made sampling a tenth of a decode step."""
    if isinstance(generator, Draws):
        return generator.categorical(probs)
    device = "cpu" if generator is None else generator.device
    cdf = probs.reshape(-1).cumsum(0, dtype=torch.float64)  # [vocab]
    u = torch.rand((), generator=generator, device=device, dtype=torch.float64).to(cdf.device) * cdf[-1]
    token = int(torch.searchsorted(cdf, u, right=True))  # the first i with cdf[i] > u
    if token >= cdf.numel():  # u rounded up to the sum itself: the last token that has probability
        token = int(torch.nonzero(probs.reshape(-1))[-1])
    return token


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
