"""What every recipe shares: a time-or-step budget, the reduced draft vocabulary, the loss curve, the recipe record.

Recipes are seeded; a run stopped by its time budget records how many steps it took, so
`--steps N` reproduces it exactly on any machine.
"""
from __future__ import annotations

import json
import math
import platform
import signal
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.training.features import FeatureSet


@dataclass(frozen=True)
class Budget:
    minutes: float = 10.0  # wall-clock budget of the optimisation loop
    max_steps: int = 0  # 0 = until the time budget ends; N = exactly N steps (reproducible)

    def progress(self, desc: str) -> BudgetBar:
        return BudgetBar(self, desc)


class BudgetBar:
    """Iterates step numbers until the step or time budget ends, showing a tqdm bar.

    SIGTERM or SIGINT (Ctrl-C) ends the loop as a spent budget does, after the current step, so the recipe
    still writes its best weights and its record: the best weights live in memory until the loop ends, and
    a sitting killed outright lost all of them (`stopped_by` names the signal)."""

    def __init__(self, budget: Budget, desc: str):
        self.budget = budget
        self.bar = tqdm(total=budget.max_steps or None, desc=desc, unit="step")
        self.start = time.perf_counter()
        self.steps = 0
        self.stopped_by: str | None = None

    def __iter__(self):
        previous = self._catch_signals()
        try:
            while self.stopped_by is None:
                if self.budget.max_steps and self.steps >= self.budget.max_steps:
                    break
                if not self.budget.max_steps and time.perf_counter() - self.start > self.budget.minutes * 60:
                    break
                yield self.steps
                self.steps += 1
                self.bar.update(1)
        finally:
            for signum, handler in previous.items():
                signal.signal(signum, handler)
            self.bar.close()
        if self.stopped_by is not None:
            print(f"{self.stopped_by}: stopped after {self.steps} steps; writing the best weights so far",
                  file=sys.stderr, flush=True)

    def _catch_signals(self) -> dict:
        """Install the stop handlers (the main thread only: elsewhere Python cannot); the old ones, to restore."""
        if threading.current_thread() is not threading.main_thread():
            return {}

        def stop(signum, _frame):
            self.stopped_by = signal.Signals(signum).name

        previous = {}
        for signum in (signal.SIGTERM, signal.SIGINT):
            previous[signum] = signal.signal(signum, stop)
        return previous

    def show(self, loss: float) -> None:
        self.bar.set_postfix(loss=f"{loss:.3f}")

    @property
    def elapsed_s(self) -> float:
        return time.perf_counter() - self.start

    @property
    def fraction(self) -> float:
        """How much of this budget is spent, 0..1: steps over max_steps, else time over minutes (a learning-rate
        schedule that follows it ends where the sitting ends, whichever budget it has)."""
        if self.budget.max_steps:
            return min(self.steps / self.budget.max_steps, 1.0)
        return min(self.elapsed_s / (self.budget.minutes * 60), 1.0)


def learning_rate(recipe, step: int, fraction: float) -> float:
    """The step size at global `step`, `fraction` (0..1) of the way through this sitting's budget.

    recipe: any recipe with lr, warmup_steps, lr_schedule and min_lr_ratio. Linear warm-up over warmup_steps,
    then "constant" (lr: sittings that more will follow) or "cosine" (down to lr * min_lr_ratio by the budget's
    end: a run's last sitting, where the loss falls further once the step size shrinks)."""
    warmup = min(1.0, (step + 1) / max(recipe.warmup_steps, 1))
    if recipe.lr_schedule == "constant":
        return recipe.lr * warmup
    floor = recipe.lr * recipe.min_lr_ratio
    return warmup * (floor + (recipe.lr - floor) * 0.5 * (1.0 + math.cos(math.pi * fraction)))


def reduced_vocab(fs: FeatureSet, size: int) -> torch.Tensor:
    """The `size` most frequent target-greedy tokens (FR-Spec's idea): [size] int64, sorted ids.

    Draft heads only ever propose these; verification stays lossless, and the draft LM-head matmul
    shrinks from the full vocabulary to `size` rows (the largest matmul a draft step does).
    """
    counts = torch.bincount(torch.cat([fs.next_ids, fs.ids]), minlength=int(fs.ids.max()) + 1)
    size = min(size, int((counts > 0).sum()))
    return torch.topk(counts.float(), size).indices.sort().values


def to_reduced(labels: torch.Tensor, vocab_ids: torch.Tensor, full_vocab: int) -> torch.Tensor:
    """Full-vocabulary labels -> indices into vocab_ids, -100 (ignored) where outside it."""
    lookup = torch.full((full_vocab,), -100, dtype=torch.long)
    lookup[vocab_ids] = torch.arange(len(vocab_ids))
    return lookup[labels]


def save_loss_curve(losses: list[float], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot(losses, linewidth=0.6, alpha=0.4, label="step")
    if len(losses) >= 20:
        window = max(5, len(losses) // 50)
        smooth = torch.tensor(losses).unfold(0, window, 1).mean(1).tolist()
        ax.plot(range(window - 1, len(losses)), smooth, label=f"mean of {window}")
    ax.set_xlabel("step")
    ax.set_ylabel("training loss")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def command_line() -> str | None:
    """The `specdec ...` command this process runs, None when it is not the CLI (tests, scripts)."""
    return " ".join(["specdec", *sys.argv[1:]]) if sys.argv and "specdec" in sys.argv[0] else None


def write_recipe(out: Path, recipe: dict) -> None:
    """recipe.json: the config, the command that ran, how many steps, results; the record beside the weights."""
    record = {"command": command_line(),
              "python": platform.python_version(), "torch": torch.__version__, **recipe}
    (out / "recipe.json").write_text(json.dumps(record, indent=2, default=str))


def positions_with_offsets(fs: FeatureSet, num_ahead: int) -> torch.Tensor:
    """Positions t whose sequence still holds t + num_ahead: [num_positions] int64."""
    keep = []
    for a, b in zip(fs.cu_seqlens[:-1].tolist(), fs.cu_seqlens[1:].tolist()):
        if b - a > num_ahead:
            keep.append(torch.arange(a, b - num_ahead))
    return torch.cat(keep) if keep else torch.zeros(0, dtype=torch.long)


class BestKeeper:
    """Early stopping on a held-out score: with a few tens of thousands of tokens, small heads memorise
    their training text within minutes, so the weights shipped are those that did best on held-out text."""

    def __init__(self, module: torch.nn.Module):
        self.module = module
        self.best_score = float("-inf")
        self.best_step = -1
        self.state: dict | None = None

    def offer(self, score: float, step: int) -> None:
        if score > self.best_score:
            self.best_score, self.best_step = score, step
            self.state = {k: v.detach().clone() for k, v in self.module.state_dict().items()}

    def restore(self) -> None:
        if self.state is not None:
            self.module.load_state_dict(self.state)


def skip_prompt_start(fs: FeatureSet, positions: torch.Tensor, skip: int = 32) -> torch.Tensor:
    """positions whose offset in their sequence is >= skip: held-out scores leave out the fixed system
    prompt every chat sequence opens with (memorised at once, never drafted at inference)."""
    seq = torch.searchsorted(fs.cu_seqlens, positions, right=True) - 1
    return positions[positions - fs.cu_seqlens[seq] >= skip]


def prepare(fs: FeatureSet, recipe) -> tuple[torch.Generator, FeatureSet, FeatureSet, torch.Tensor]:
    """What every recipe starts from: seeded RNGs, a train / held-out split (a fifth at most held
    out), and the reduced draft vocabulary of the training half. Returns (gen, train, heldout, vocab_ids)."""
    torch.manual_seed(recipe.seed)
    gen = torch.Generator().manual_seed(recipe.seed)
    train, heldout = fs.split(min(recipe.num_heldout_seqs, max(fs.num_seqs // 5, 1)))
    return gen, train, heldout, reduced_vocab(train, recipe.vocab_size)
