"""One sequence's speculation state: its acceptance estimate and its own choice of draft depth.

Acceptance (chain view): each draft token is accepted with probability alpha, independently, until
the first rejection. alpha = accepted / (accepted + rejections), the maximum-likelihood estimate for
a truncated geometric, over exponentially decayed counts. This one estimate serves both the depth
choice below and the batch node budget (specdec.policy.budget), so the two never disagree.

Depth choice: drafting k gives E[tokens] = (1 - alpha^(k+1)) / (1 - alpha) per step. A step costs
t_plain for k = 0 and t_plain + a + b * k otherwise: `a` is the verify forward's fixed extra cost over
a one-token forward (large on CPUs) and `b` the per-token cost of drafting and verifying, both fitted
online by decayed least squares. We pick k in [0, max_depth] maximising E[tokens] / cost. When k = 0
wins we still probe with a short draft now and then, backing off while probes fail, so a prompt whose
drafts are always wrong costs only the probes. Everything here depends on the past only.
"""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class DepthConfig:
    max_depth: int = 8
    adaptive: bool = True  # False: always draft max_depth
    decay: float = 0.9  # weight of history in counts and timing fits
    probe_tokens: int = 2
    min_probe_interval: int = 4
    max_probe_interval: int = 64


@dataclass
class Acceptance:
    """Decayed counts of accepted draft tokens and of rejections (a step that stopped short)."""

    accepted: float = 1.0
    rejections: float = 1.0

    @property
    def alpha(self) -> float:
        return self.accepted / (self.accepted + self.rejections)

    def record(self, depth: int, num_accepted: int, decay: float) -> None:
        """A step that drafted `depth` deep (> 0) and accepted num_accepted <= depth of them."""
        self.accepted = decay * self.accepted + num_accepted
        self.rejections = decay * self.rejections + (1.0 if num_accepted < depth else 0.0)

    def prior(self, weight: float = 2.0) -> Acceptance:
        """A new sequence's start: this estimate's mean, worth `weight` pseudo-steps."""
        total = self.accepted + self.rejections
        return Acceptance(weight * self.accepted / total, weight * self.rejections / total)


@dataclass
class DepthController:
    config: DepthConfig
    acceptance: Acceptance = field(default_factory=Acceptance)
    t_plain: float | None = None
    fit: list[float] = field(default_factory=lambda: [0.0] * 5)  # decayed n, sum k, sum k^2, sum y, sum k y
    steps_since_spec: int = 0
    probe_interval: int = 0

    def __post_init__(self) -> None:
        self.probe_interval = self.probe_interval or self.config.min_probe_interval

    @property
    def alpha(self) -> float:
        return self.acceptance.alpha

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

    def depth(self) -> int:
        """Draft depth for the next step (0 = a plain step)."""
        cfg = self.config
        if not cfg.adaptive:
            return cfg.max_depth
        if self.t_plain is None:  # measure one plain step first
            return 0
        if self.fit[0] == 0.0:  # then one short speculative step: cheap if drafts turn out wrong
            return min(cfg.probe_tokens, cfg.max_depth)
        best = max(range(cfg.max_depth + 1), key=self.expected_rate)
        if best == 0 and self.steps_since_spec >= self.probe_interval:
            return min(cfg.probe_tokens, cfg.max_depth)
        return best

    def record(self, depth: int, num_accepted: int, step_s: float) -> None:
        """One step's outcome: depth drafted (0 = plain step), accepted count, draft + verify seconds."""
        d = self.config.decay
        if depth == 0:
            self.t_plain = step_s if self.t_plain is None else d * self.t_plain + (1 - d) * step_s
            self.steps_since_spec += 1
            return
        self.acceptance.record(depth, min(num_accepted, depth), d)
        if self.t_plain is not None:
            k, y = float(depth), step_s - self.t_plain
            self.fit = [d * s + v for s, v in zip(self.fit, (1.0, k, k * k, y, k * y))]
        if self.steps_since_spec >= self.probe_interval:  # this was a probe
            paid = self.expected_rate(depth) > 1.0 / self.t_plain
            self.probe_interval = (self.config.min_probe_interval if paid
                                   else min(2 * self.probe_interval, self.config.max_probe_interval))
        self.steps_since_spec = 0
