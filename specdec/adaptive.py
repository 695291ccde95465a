"""How many tokens to draft next step, from measured acceptance and measured costs.

Model (chain view): each draft token is accepted with probability alpha, independently, until the
first rejection, so drafting k gives E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) per step. A step
costs t_plain for k = 0 and t_plain + a + b * k otherwise: `a` is the verify forward's fixed extra
cost over a 1-token forward (large on CPUs: SmolLM2 takes 53 ms for 1 token, ~100 ms for 2-8) and
`b` the per-token cost of drafting and verifying, both fitted online by decayed least squares. We
pick k in [0, max_tokens] maximising E[tokens] / cost. When k = 0 wins we still probe with a short
draft now and then, backing off while probes fail, so a prompt whose drafts are always wrong costs
only the probes: a few percent over plain decoding.

alpha = accepted / (accepted + rejections), the maximum-likelihood estimate for a truncated
geometric, over exponentially decayed counts. The choice of k depends only on the past, so it
never affects losslessness; it does make seeded sampling depend on timings (disable to pin it).
"""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class AdaptiveConfig:
    max_tokens: int = 8
    enabled: bool = True
    decay: float = 0.9  # weight of history in counts and timing fits
    probe_tokens: int = 2
    min_probe_interval: int = 4
    max_probe_interval: int = 64


class SpeculationController:
    def __init__(self, config: AdaptiveConfig):
        self.config = config
        self.accepted, self.rejections = 1.0, 1.0  # prior alpha = 0.5; the first speculative step is max depth anyway
        self.t_plain: float | None = None
        self.fit = [0.0] * 5  # decayed sums for y = a + b k: n, sum k, sum k^2, sum y, sum k y
        self.steps_since_spec = 0
        self.probe_interval = config.min_probe_interval

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    def step_cost(self, k: int) -> float:
        if k == 0:
            return self.t_plain
        n, sk, skk, sy, sky = self.fit
        det = n * skk - sk * sk
        b = max((n * sky - sk * sy) / det, 0.0) if det > 1e-9 * max(n * skk, 1e-30) else 0.0
        a = max((sy - b * sk) / n, 0.0)
        return self.t_plain + a + b * k

    def expected_rate(self, k: int) -> float:
        alpha = min(self.alpha, 0.999)
        return (1 - alpha ** (k + 1)) / (1 - alpha) / self.step_cost(k)

    def num_tokens(self) -> int:
        cfg = self.config
        if not cfg.enabled:
            return cfg.max_tokens
        if self.t_plain is None:  # measure one plain step first
            return 0
        if self.fit[0] == 0.0:  # then one short speculative step: cheap if drafts turn out wrong
            return min(cfg.probe_tokens, cfg.max_tokens)
        best = max(range(cfg.max_tokens + 1), key=self.expected_rate)
        if best == 0 and self.steps_since_spec >= self.probe_interval:
            return min(cfg.probe_tokens, cfg.max_tokens)
        return best

    def record(self, num_drafted: int, num_accepted: int, step_s: float) -> None:
        """One step's outcome: draft depth proposed (0 = plain step), accepted count, draft + verify time."""
        d = self.config.decay
        if num_drafted == 0:
            self.t_plain = step_s if self.t_plain is None else d * self.t_plain + (1 - d) * step_s
            self.steps_since_spec += 1
            return
        self.accepted = d * self.accepted + num_accepted
        self.rejections = d * self.rejections + (1.0 if num_accepted < num_drafted else 0.0)
        if self.t_plain is not None:
            k, y = float(num_drafted), step_s - self.t_plain
            self.fit = [d * s + v for s, v in zip(self.fit, (1.0, k, k * k, y, k * y))]
        if self.steps_since_spec >= self.probe_interval:  # this was a probe
            paid = self.expected_rate(num_drafted) > 1.0 / self.t_plain
            self.probe_interval = (self.config.min_probe_interval if paid
                                   else min(2 * self.probe_interval, self.config.max_probe_interval))
        self.steps_since_spec = 0
