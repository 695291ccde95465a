"""The methods a benchmark compares, by name, and how each one generates.

A method is plain data (`MethodSpec`) plus a runner built once per benchmark over the one loaded
target. The project's methods are `Engine`s that differ only in their drafter; the peers are
transformers' own `generate` on the very same model object (plain, assisted by the same draft
checkpoint, prompt lookup), which is what a user would reach for instead. Medusa and EAGLE are
listed by name: they run by default once a trained checkpoint is found (shipped for the embedded
target, or named with `checkpoints`), and the draft model uses the shipped distilled draft when there
is one, else a random stand-in, exactly as `Engine.from_pretrained` would.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Protocol

import torch

from specdec.core.types import SamplingParams
from specdec.drafters import DRAFTERS, SELF_DRAFTERS, build_drafter, checkpoint_name
from specdec.drafters.trained import shipped_checkpoint
from specdec.engine import DEFAULT_DEPTH, Engine, EngineConfig
from specdec.errors import InvalidArgument
from specdec.models.loader import LoadedModel, load_model, random_draft_path

BASELINE = "plain"


@dataclass(frozen=True)
class MethodSpec:
    name: str
    family: str  # "specdec" (the project's engine) or "transformers" (a peer)
    description: str
    drafter: str = "none"  # specdec drafter name (family "specdec")
    drafter_options: tuple[tuple[str, int | float | str], ...] = ()
    hf_mode: str = ""  # "plain" | "assisted" | "lookup" (family "transformers")
    peer: str | None = None  # the transformers method that does the same thing

    @property
    def available(self) -> bool:
        return self.family == "transformers" or self.drafter in DRAFTERS

    def to_dict(self) -> dict:
        return {"name": self.name, "family": self.family, "description": self.description,
                "drafter": self.drafter if self.family == "specdec" else None,
                "drafter_options": dict(self.drafter_options), "peer": self.peer}


METHODS = (
    MethodSpec(BASELINE, "specdec", "plain autoregressive decoding (the baseline of every ratio)", peer="hf-generate"),
    MethodSpec("ngram", "specdec", "prompt lookup, scored trie of 3 continuations", "ngram", peer="hf-lookup"),
    MethodSpec("ngram-tree", "specdec", "prompt lookup, trie of 4 continuations", "ngram",
               (("num_branches", 4),), peer="hf-lookup"),
    MethodSpec("suffix", "specdec", "suffix decoding: tries over the request and earlier outputs, "
               "a tree of the most frequent continuations", "suffix"),
    MethodSpec("draft", "specdec", "draft model, chain", "draft", peer="hf-assisted"),
    MethodSpec("draft-tree", "specdec", "draft model, tree of width 2", "draft", (("tree_width", 2),),
               peer="hf-assisted"),
    MethodSpec("medusa", "specdec", "Medusa heads (self-drafting, static tree)", "medusa"),
    MethodSpec("eagle", "specdec", "EAGLE-style head (self-drafting, dynamic tree)", "eagle"),
    MethodSpec("eagle3", "specdec", "EAGLE-3-style head (fused low/middle/high features, training-time test, "
               "dynamic tree)", "eagle3"),
    MethodSpec("hybrid", "specdec", "suffix decoding and Medusa heads, their trees merged and cut by their "
               "scores", "hybrid"),
    MethodSpec("hybrid-choose", "specdec", "suffix decoding's tree where it expects a token or more, Medusa's "
               "otherwise", "hybrid", (("mode", "choose"),)),
    MethodSpec("hf-generate", "transformers", "transformers generate()", hf_mode="plain"),
    MethodSpec("hf-assisted", "transformers", "transformers assisted generation with the same draft model "
               "(its defaults: up to 20 tokens per step, assistant confidence threshold 0.4)", hf_mode="assisted"),
    MethodSpec("hf-lookup", "transformers", "transformers prompt lookup decoding (num_speculative_tokens per "
               "step, n-grams up to 2)", hf_mode="lookup"),
)


def resolve_methods(names: list[str] | tuple[str, ...] | None) -> tuple[MethodSpec, ...]:
    """Specs for `names` (None = every available method), the baseline always first. Needs no model."""
    by_name = {m.name: m for m in METHODS}
    if names is None:
        names = [m.name for m in METHODS if m.available]
    unknown = [n for n in names if n not in by_name]
    if unknown:
        raise InvalidArgument(f"unknown methods {', '.join(unknown)}; choose from {', '.join(by_name)}")
    missing = [n for n in names if not by_name[n].available]
    if missing:
        raise InvalidArgument(f"methods {', '.join(missing)} need drafters this build lacks "
                              f"(available drafters: {', '.join(DRAFTERS)})")
    ordered = [BASELINE] + [n for n in dict.fromkeys(names) if n != BASELINE]
    return tuple(by_name[n] for n in ordered)


def checkpoint_for(spec: MethodSpec, target: LoadedModel, checkpoints: dict[str, str]) -> str | None:
    """The trained checkpoint a specdec method loads: named by the user, else shipped for this target."""
    if spec.family != "specdec" or spec.drafter in ("none", "ngram", "suffix"):
        return None
    name = checkpoint_name(spec.drafter)  # hybrid loads medusa's
    if name in checkpoints:
        return checkpoints[name]
    shipped = shipped_checkpoint(name, target)
    return str(shipped) if shipped is not None else None


def runnable(spec: MethodSpec, target: LoadedModel, checkpoints: dict[str, str]) -> bool:
    """Self-drafting heads need a trained checkpoint; everything else can always run (the draft model
    falls back to a random stand-in)."""
    return spec.drafter not in SELF_DRAFTERS or checkpoint_for(spec, target, checkpoints) is not None


@dataclass(frozen=True)
class MethodResult:
    """One generation. Counts follow the engine's: a target forward is one verify step (prefill not
    counted), and each step emits accepted + 1 tokens."""

    token_ids: list[int]
    elapsed_s: float  # prefill + decode, tokenization excluded
    num_target_forwards: int
    num_draft_tokens: int
    num_accepted_tokens: int
    draft_s: float | None = None  # None where the method cannot split its time
    verify_s: float | None = None
    prefill_s: float | None = None


class Method(Protocol):
    spec: MethodSpec

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> MethodResult:
        ...


def depth_text(num_speculative_tokens: int | None) -> str:
    """A run's depth setting in words, for its report."""
    if num_speculative_tokens is not None:
        return str(num_speculative_tokens)
    return f"each drafter's default ({DEFAULT_DEPTH}; suffix and ngram: their node budget, 16)"


@dataclass(frozen=True)
class MethodSettings:
    # the project's maximum draft depth (None: each drafter's own), and transformers' prompt lookup length
    num_speculative_tokens: int | None = None
    adaptive: bool = True
    checkpoints: tuple[tuple[str, str], ...] = ()  # (drafter, dir): trained checkpoints named by the user


class SpecdecMethod:
    def __init__(self, spec: MethodSpec, engine: Engine):
        self.spec = spec
        self.engine = engine

    def generate(self, prompt_ids: list[int], params: SamplingParams) -> MethodResult:
        out = self.engine.generate(list(prompt_ids), params)
        s = out.stats
        return MethodResult(out.token_ids, s.elapsed_s, s.num_target_forwards, s.num_draft_tokens,
                            s.num_accepted_tokens, s.draft_s, s.verify_s, s.prefill_s)

    def reset(self) -> None:
        """Forget what the drafter learnt from earlier generations (the suffix drafter's global store)."""
        if hasattr(self.engine.drafter, "reset"):
            self.engine.drafter.reset()


@contextmanager
def count_forwards(model: torch.nn.Module) -> Iterator[list[int]]:
    """Record the number of new tokens each top-level forward of `model` is fed."""
    fed: list[int] = []

    def hook(_module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        fed.append(int(ids.shape[-1]) if ids is not None else int(kwargs["inputs_embeds"].shape[1]))

    handle = model.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        yield fed
    finally:
        handle.remove()


class TransformersMethod:
    """transformers `generate` on the target. Forwards are counted with a hook: the first is fed the
    prompt (plus any candidates), each later one the last emitted token plus its candidates, so
    drafted = fed - prompt_len - (forwards - 1) and accepted = emitted - forwards."""

    def __init__(self, spec: MethodSpec, model: torch.nn.Module, eos_ids: frozenset[int],
                 settings: MethodSettings, assistant: torch.nn.Module | None = None):
        self.spec = spec
        self.model = model
        self.eos_ids = sorted(eos_ids)
        self.settings = settings
        self.assistant = assistant

    def generation_kwargs(self, params: SamplingParams) -> dict:
        kwargs = {"max_new_tokens": params.max_new_tokens, "do_sample": not params.greedy,
                  "eos_token_id": self.eos_ids or None, "pad_token_id": self.eos_ids[0] if self.eos_ids else None,
                  "temperature": None, "top_p": None, "top_k": None}
        if params.ignore_eos:
            kwargs.update(eos_token_id=None, pad_token_id=None)
        if not params.greedy:
            # top_k 0 disables it explicitly: left unset, transformers would apply its default of 50.
            kwargs.update(temperature=params.temperature, top_p=params.top_p, top_k=params.top_k)
        if self.spec.hf_mode == "assisted":
            kwargs["assistant_model"] = self.assistant
        elif self.spec.hf_mode == "lookup":
            kwargs["prompt_lookup_num_tokens"] = self.settings.num_speculative_tokens or DEFAULT_DEPTH
        return kwargs

    @torch.inference_mode()
    def generate(self, prompt_ids: list[int], params: SamplingParams) -> MethodResult:
        from transformers import GenerationConfig

        kwargs = self.generation_kwargs(params)
        assistant = kwargs.pop("assistant_model", None)
        config = GenerationConfig(**kwargs)
        input_ids = torch.tensor([list(prompt_ids)], dtype=torch.long)
        if params.seed is not None:
            torch.manual_seed(params.seed)
        with count_forwards(self.model) as fed:
            start = time.perf_counter()
            out = self.model.generate(input_ids, attention_mask=torch.ones_like(input_ids),
                                      generation_config=config, assistant_model=assistant)
            elapsed_s = time.perf_counter() - start
        token_ids = out[0, len(prompt_ids):].tolist()
        num_forwards = len(fed)
        drafted = max(sum(fed) - len(prompt_ids) - (num_forwards - 1), 0)
        accepted = max(len(token_ids) - num_forwards, 0)
        return MethodResult(token_ids, elapsed_s, num_forwards, drafted, accepted)


def draft_model_path(target: LoadedModel, settings: MethodSettings) -> str:
    """The draft model every draft-model method uses, peers included: named, shipped, or random."""
    named = dict(settings.checkpoints).get("draft")
    shipped = shipped_checkpoint("draft", target)
    return named or (str(shipped) if shipped is not None else str(random_draft_path(target)))


def resolve_checkpoints(specs: tuple[MethodSpec, ...], target: LoadedModel, settings: MethodSettings
                        ) -> dict[str, str]:
    """{drafter: checkpoint dir} for every trained drafter `specs` use, the draft model included."""
    named = dict(settings.checkpoints)
    resolved = {checkpoint_name(s.drafter): checkpoint_for(s, target, named) for s in specs
                if checkpoint_for(s, target, named)}
    if any(s.drafter == "draft" or s.hf_mode == "assisted" for s in specs):
        resolved["draft"] = draft_model_path(target, settings)
    return resolved


def build_methods(specs: tuple[MethodSpec, ...], target: LoadedModel, settings: MethodSettings) -> list[Method]:
    """One runner per spec, all over the same loaded target (one copy of its weights)."""
    dtype = next(target.model.parameters()).dtype
    config = EngineConfig(num_speculative_tokens=settings.num_speculative_tokens, adaptive=settings.adaptive)
    checkpoints = resolve_checkpoints(specs, target, settings)
    eos_ids = Engine(target, None, config).eos_ids
    methods: list[Method] = []
    for spec in specs:
        if spec.family == "specdec":
            drafter = build_drafter(spec.drafter, target, checkpoint_for(spec, target, checkpoints),
                                    dict(spec.drafter_options), dtype)
            methods.append(SpecdecMethod(spec, Engine(target, drafter, config)))
        else:
            # A separate copy of the draft: transformers may adjust the assistant's generation_config.
            assistant = load_model(checkpoints["draft"], dtype).model if spec.hf_mode == "assisted" else None
            methods.append(TransformersMethod(spec, target.model, eos_ids, settings, assistant))
    return methods
