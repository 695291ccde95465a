"""The in-process speculative engine: the reference every distributed path must match.

One step reads as prose (specdec.step.decode_step):
    budget = policy.plan(seq)                            # how deep, how many nodes: fixed before drafting
    tree   = session.propose(context, budget)            # drafter guesses (maybe nothing)
    logits = target.forward([root] + tree.tokens)        # one forward, tree attention
    result = verify(tree, logits)                        # accepted path + one recovered/bonus token
    cache.commit(root + accepted path)                   # commit; the sequence version goes up
Plain decoding is the same loop with an empty tree, so the baseline shares every line but drafting.
"""
from __future__ import annotations

import dataclasses
import random
import time
from dataclasses import dataclass
from typing import Iterator

from specdec.core.types import (DEFAULT_KV_CACHE, DEFAULT_LINEAR_KERNEL, DEFAULT_PREFIX_CACHE_MB, GenerationOutput,
                                GenerationStats, SamplingParams, tally_accepted)
from specdec.drafters import build_drafter
from specdec import parallel
from specdec.errors import InvalidArgument
from specdec.device import placement
from specdec.models.loader import LoadedModel, load_model, resolve_path
from specdec.models.runner import ModelRunner, RunnerConfig
from specdec.parallel import check_tp_degree
from specdec.policy import PolicyConfig, SpeculationPolicy
from specdec.policy.budget import BudgetConfig
from specdec.sequence import Sequence
from specdec.step import Drafting, StepFailure, decode_step
from specdec.batch_cache import BatchCache

Prompt = str | list[int] | list[dict]


DEFAULT_DEPTH = 8  # the most draft tokens per step where neither the caller nor the drafter says otherwise


@dataclass(frozen=True)
class EngineConfig:
    # The most draft tokens (tree depth) per step; None: the drafter's `default_depth`, else DEFAULT_DEPTH.
    num_speculative_tokens: int | None = None
    adaptive: bool = True  # follow acceptance and cost (see adaptive.py); False = always the maximum
    max_tree_nodes: int = 64
    policy: PolicyConfig | None = None  # the speculation policy's knobs (None: from the two fields above)
    runner: RunnerConfig = RunnerConfig()  # how the target's (and a draft model's) forwards run: KV cache kind

    def __post_init__(self) -> None:
        if self.num_speculative_tokens is not None and not 1 <= self.num_speculative_tokens <= self.max_tree_nodes:
            raise InvalidArgument(f"num_speculative_tokens must be in [1, {self.max_tree_nodes}], "
                                  f"got {self.num_speculative_tokens}")


@dataclass(frozen=True)
class StreamEvent:
    """One verify step's output; the last event of a generation carries the whole `output`."""

    text: str
    token_ids: list[int]
    output: GenerationOutput | None = None


class Engine:
    def __init__(self, target: LoadedModel, drafter=None, config: EngineConfig = EngineConfig()):
        self.target = target
        self.tokenizer = target.tokenizer
        self.runner = ModelRunner(target.model, config=config.runner)
        if getattr(drafter, "feature_layers", ()):  # an EAGLE-3-style head reads low, middle and high layers
            self.runner.capture_layers(drafter.feature_layers)
        self.drafter = drafter
        self.config = config
        self.max_len = getattr(target.model.config, "max_position_embeddings", None) or 1 << 30
        self.eos_ids = self._eos_ids()
        # A drafter whose cost grows with every level (a draft model, EAGLE) keeps the general default; one
        # that scores its own nodes (suffix) names its own, as the policy sizes its trees by cost anyway.
        self.num_speculative_tokens = (config.num_speculative_tokens
                                       or getattr(drafter, "default_depth", DEFAULT_DEPTH))
        self.last_policy: SpeculationPolicy | None = None  # the last finished generation's

    @classmethod
    def from_pretrained(cls, target: str | None = None, drafter: str = "none", draft: str | None = None,
                        *, dtype: str = "auto", num_speculative_tokens: int | None = None, adaptive: bool = True,
                        tp: int = 1, kv_cache: str = DEFAULT_KV_CACHE, device: str = "auto",
                        cuda_graphs: bool | None = None, linear_kernel: str = DEFAULT_LINEAR_KERNEL,
                        prefix_cache_mb: int = DEFAULT_PREFIX_CACHE_MB, **drafter_options) -> Engine:
        """target None = the embedded SmolLM2-135M-Instruct; drafter none | ngram | draft | medusa | eagle.
        kv_cache: static (preallocated, the default) | dynamic (transformers' DynamicCache).
        device: auto (cuda when a GPU is visible, else cpu) | cpu | cuda | cuda:N; under tp each rank
        takes its own GPU. A draft model runs on the target's device.
        cuda_graphs: verify forwards as CUDA graphs for padded shapes (specdec.graphs). None: wherever they
            run (one CUDA device, a static cache); True: asked for (eager elsewhere, said once); False: eager.
        linear_kernel: auto | specdec | torch (specdec.kernels.linear; auto = specdec's on a CPU).
        prefix_cache_mb: prompt openings' keys and values kept across requests (specdec.models.prefix_cache; 0 = off)."""
        runner = RunnerConfig(kv_cache=kv_cache, cuda_graphs=cuda_graphs, linear_kernel=linear_kernel,
                              prefix_cache_mb=prefix_cache_mb)
        config = EngineConfig(num_speculative_tokens=num_speculative_tokens, adaptive=adaptive, runner=runner)
        torch_device, torch_dtype = placement(device, dtype, tp, target=target, linear_kernel=linear_kernel,
                                              kv_cache=kv_cache)  # refused here, before any weight loads
        if tp > 1:
            from transformers import AutoConfig

            check_tp_degree(AutoConfig.from_pretrained(resolve_path(target), local_files_only=True), tp)
            if parallel.init_from_env(device=torch_device) != tp:
                raise InvalidArgument(f"tp={tp} needs {tp} processes in a torch.distributed group: "
                                      f"run `specdec generate --tp {tp} ...` or torchrun --nproc-per-node {tp}")
        loaded = load_model(target, torch_dtype, tp_degree=tp, device=torch_device)
        draft_runner = dataclasses.replace(runner, cuda_graphs=False, prefix_cache_mb=0)  # one row at a time
        return cls(loaded, build_drafter(drafter, loaded, draft, drafter_options, torch_dtype, draft_runner), config)

    def new_policy(self, load_aware: bool = True, costs: tuple[tuple[int, float], ...] = ()) -> SpeculationPolicy:
        """The speculation policy for this engine's sequences (depth, node budget, acceptance). costs:
        ((rows, seconds), ...) of verify forwards measured beforehand (specdec.policy.calibrate), the
        batch budget's starting point. Its batches are priced as this runner verifies them (ragged or padded).
        It starts from the step costs the engine's last finished generation or batch run measured
        (`last_policy`, which each run sets when it ends), not from its own cold first steps."""
        if self.config.policy is not None:
            policy = SpeculationPolicy(self.config.policy, ragged=self.runner.ragged)
        else:
            budget = BudgetConfig(enabled=load_aware, costs=costs) if costs else None
            config = PolicyConfig(max_depth=self.num_speculative_tokens, adaptive=self.config.adaptive,
                                  load_aware=load_aware, budget=budget)
            policy = SpeculationPolicy(config, ragged=self.runner.ragged)
        return policy if self.last_policy is None else policy.continue_from(self.last_policy)

    def _eos_ids(self) -> frozenset[int]:
        ids: set[int] = set()
        for source in (getattr(self.target.model, "generation_config", None), self.tokenizer):
            value = getattr(source, "eos_token_id", None)
            ids.update([value] if isinstance(value, int) else (value or []))
        return frozenset(ids)

    def encode(self, prompt: Prompt, chat: bool = False) -> list[int]:
        """Token ids for a string, a list of ids, or chat messages ([{"role", "content"}])."""
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidArgument("prompt is empty")
            if self.tokenizer is None:
                raise InvalidArgument("this model has no tokenizer: pass the prompt as a list of token ids")
            if chat:
                prompt = [{"role": "user", "content": prompt}]
            else:
                return self.tokenizer.encode(prompt)
        if isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt):
            if self.tokenizer is None or not getattr(self.tokenizer, "chat_template", None):
                raise InvalidArgument("chat messages need a tokenizer with a chat template")
            text = self.tokenizer.apply_chat_template(list(prompt), add_generation_prompt=True, tokenize=False)
            return self.tokenizer.encode(text, add_special_tokens=False)
        if not isinstance(prompt, (list, tuple)) or not prompt:
            raise InvalidArgument("prompt is empty" if isinstance(prompt, (list, tuple)) else
                                  f"prompt must be a string, token ids or chat messages, not {type(prompt).__name__}")
        vocab_size = self.runner.vocab_size
        for token in prompt:
            if not isinstance(token, int) or not 0 <= token < vocab_size:
                raise InvalidArgument(f"prompt token id {token!r} is outside the vocabulary [0, {vocab_size})")
        return list(prompt)

    def generate(self, prompt: Prompt, params: SamplingParams | None = None, chat: bool = False) -> GenerationOutput:
        for event in self.stream(prompt, params, chat):
            if event.output is not None:
                return event.output
        raise AssertionError("stream ended without an output")

    def stream(self, prompt: Prompt, params: SamplingParams | None = None, chat: bool = False
               ) -> Iterator[StreamEvent]:
        params = params or SamplingParams()
        if not params.greedy and params.seed is None and parallel.world_size() > 1:  # same draws on every rank
            params = dataclasses.replace(params, seed=parallel.broadcast_int(random.randrange(2 ** 62)))
        prompt_ids = self.encode(prompt, chat)
        if len(prompt_ids) + params.max_new_tokens > self.max_len:
            raise InvalidArgument(f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({params.max_new_tokens}) "
                                  f"exceeds the model's context of {self.max_len} tokens")
        if params.stop and self.tokenizer is None:
            raise InvalidArgument("stop strings need a model with a tokenizer")
        session = self.drafter.new_session() if self.drafter is not None else None
        policy = self.new_policy(load_aware=False)  # one sequence: its own depth choice decides
        policy.add("0")
        pool = BatchCache(self.runner)
        start = time.perf_counter()
        seq = Sequence(self.runner, prompt_ids, params, self.tokenizer, self.eos_ids,
                       keep_features=bool(getattr(session, "needs_features", False)))
        if hasattr(session, "attach"):  # self-drafting heads (Medusa, EAGLE) read the target's features
            session.attach(seq)
        entry = Drafting("0", seq, session)
        num_forwards = num_drafted = num_accepted = num_drafts = 0
        accepted_per_pos: list[int] = []
        draft_s = verify_s = 0.0
        while seq.finish_reason is None:
            _, (step,), step_draft_s = decode_step(self.runner, policy, pool, [entry], self.max_len)
            if isinstance(step, StepFailure):
                raise RuntimeError(step.reason)
            num_forwards += 1
            num_drafted += step.num_drafted
            num_accepted += step.num_accepted
            num_drafts += step.num_drafted > 0
            tally_accepted(accepted_per_pos, step.num_accepted)
            draft_s += step_draft_s
            verify_s += step.verify_s
            if seq.finish_reason is None:
                yield StreamEvent(step.text, step.token_ids)
        stats = GenerationStats(len(seq.generated_ids), num_forwards, num_drafted, num_accepted,
                                time.perf_counter() - start, draft_s, verify_s, seq.prefill_s, num_drafts,
                                tuple(accepted_per_pos))
        output = GenerationOutput(list(seq.generated_ids), seq.text.text, stats, seq.finish_reason, prompt_ids)
        policy.remove("0")
        self.last_policy = policy  # the next generation starts from its step costs (not its acceptance)
        if hasattr(session, "close"):  # drafters that learn from finished generations (suffix) keep this one
            session.close(seq.context, len(prompt_ids))
        yield StreamEvent(step.text, step.token_ids, output)
