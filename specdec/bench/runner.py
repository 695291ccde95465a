"""The timed loop: every method on every question, interleaved, plus the greedy equality check.

Methods run one after another on the same question (the order rotates from question to question),
so a burst of load from a neighbour on a shared machine hits all methods alike rather than
whichever one happened to be running; ratios within a run stay meaningful when absolute times
do not. Under greedy decoding every method must reproduce the baseline's token ids exactly (the
lossless contract); the first differing position is recorded to tell a real bug from a tie.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

from specdec.bench.methods import BASELINE, Method, MethodResult
from specdec.bench.questions import Question
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument

MODES = ("greedy", "sampling")


@dataclass(frozen=True)
class ModeConfig:
    name: str  # "greedy" or "sampling"
    max_new_tokens: int
    temperature: float = 0.0  # sampling mode only
    top_p: float = 1.0
    seed: int = 0  # sampling: question i uses seed + i for every method

    def __post_init__(self) -> None:
        if self.name not in MODES:
            raise InvalidArgument(f"mode must be one of {', '.join(MODES)}, got {self.name!r}")
        if self.name == "sampling" and self.temperature <= 0:
            raise InvalidArgument("the sampling mode needs a temperature > 0")
        self.params(0)  # validates the sampling parameters before any model is loaded

    @property
    def greedy(self) -> bool:
        return self.name == "greedy"

    def params(self, question_index: int) -> SamplingParams:
        if self.greedy:
            return SamplingParams(max_new_tokens=self.max_new_tokens)
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, max_new_tokens=self.max_new_tokens,
                              seed=self.seed + question_index)


@dataclass(frozen=True)
class Sample:
    """One method on one question in one mode."""

    mode: str
    method: str
    question_id: int
    category: str
    prompt_len: int
    num_new_tokens: int
    elapsed_s: float
    num_target_forwards: int
    num_draft_tokens: int
    num_accepted_tokens: int
    draft_s: float | None
    verify_s: float | None
    prefill_s: float | None
    mismatch: bool | None  # greedy: token ids differ from the baseline's; None when not checked
    first_mismatch_at: int | None  # index of the first differing token (or the shorter length)

    def to_dict(self) -> dict:
        return asdict(self)


def first_difference(a: Sequence[int], b: Sequence[int]) -> int | None:
    """Index where two token id lists first differ (a length difference counts); None if equal."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def warm_up(methods: list[Method], prompt_ids: list[int], max_new_tokens: int = 8) -> None:
    """One short untimed generation per method: lazy initialisation is not what we measure."""
    for method in methods:
        method.generate(prompt_ids, SamplingParams(max_new_tokens=max_new_tokens))


def run_mode(mode: ModeConfig, questions: list[Question], prompts: list[list[int]], methods: list[Method],
             on_sample: Callable[[Sample], None] | None = None) -> list[Sample]:
    """Every method on every question. prompts[i] is questions[i] encoded through the chat template."""
    names = [m.spec.name for m in methods]
    if BASELINE not in names:
        raise InvalidArgument(f"the method list must include the baseline {BASELINE!r}")
    for method in methods:  # no question may be drafted from its own answer in an earlier mode or the warm-up
        if hasattr(method, "reset"):
            method.reset()
    samples: list[Sample] = []
    for index, (question, prompt_ids) in enumerate(zip(questions, prompts)):
        params = mode.params(index)
        shift = index % len(methods)
        results: dict[str, MethodResult] = {}
        for method in methods[shift:] + methods[:shift]:
            results[method.spec.name] = result = method.generate(prompt_ids, params)
            if on_sample is not None:
                on_sample(_sample(mode, method.spec.name, question, prompt_ids, result, None))
        baseline_ids = results[BASELINE].token_ids
        for name in names:
            result = results[name]
            diff = first_difference(result.token_ids, baseline_ids) if mode.greedy else None
            mismatch = (diff is not None) if mode.greedy else None
            samples.append(_sample(mode, name, question, prompt_ids, result, (mismatch, diff)))
    return samples


def _sample(mode: ModeConfig, name: str, question: Question, prompt_ids: list[int], r: MethodResult,
            check: tuple[bool | None, int | None] | None) -> Sample:
    mismatch, diff = check or (None, None)
    return Sample(mode.name, name, question.question_id, question.category, len(prompt_ids), len(r.token_ids),
                  r.elapsed_s, r.num_target_forwards, r.num_draft_tokens, r.num_accepted_tokens, r.draft_s,
                  r.verify_s, r.prefill_s, mismatch, diff)
