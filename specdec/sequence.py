"""One sequence's authoritative state on the target: committed tokens, KV cache, version, text.

A verify step (specdec.step, where a single sequence is a batch of one) runs the target forward,
asks each Sequence to `verify` its tree against its logits, commits the KV cache, then lets the
Sequence `commit_verified`: version, tokens, stop checks. Every path (engine, batching, target
worker, tensor-parallel followers) drives sequences through that one step, which is why the
distributed paths match the engine token for token.

Prefill puts every prompt token but the last in the cache. In process it runs at once; the target
worker opens a sequence unprefilled and feeds its prompt in chunks between other sequences' decode
steps (`prefill_chunk`), so a long prompt never holds the model for seconds while streams wait.

A sequence can also be opened to resume a generation another target began and lost (`resumed_ids`,
router failover): those tokens go into the cache with the prompt, count against max_new_tokens and
replay through the text stream without being emitted again, so the resumed sequence is in the state
the lost one was in after the same tokens. A seeded sampled sequence reseeds its generator from
(seed, committed length) at every commit (`step_seed`), so its random state is that same state too.
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass

import torch

from specdec.core.sampling import WarpedRows, make_generator, step_seed
from specdec.core.tree import DraftTree, TreeLayout
from specdec.core.types import SamplingParams
from specdec.core.verify import VerifyResult, verify_greedy, verify_sampling
from specdec.models.runner import ModelRunner
from specdec.textstream import TextStream


@dataclass(frozen=True)
class StepResult:
    token_ids: list[int]  # newly committed tokens (after EOS / stop / length truncation)
    text: str  # newly emitted text
    num_drafted: int  # tree nodes verified
    num_accepted: int
    depth: int  # the tree's depth (what the adaptive controller counts in)
    verify_s: float


class Sequence:
    def __init__(self, runner: ModelRunner, prompt_ids: list[int], params: SamplingParams,
                 tokenizer=None, eos_ids: frozenset[int] = frozenset(), keep_features: bool = False,
                 prefill: bool = True, resumed_ids: list[int] | tuple[int, ...] = ()):
        self.runner = runner
        self.params = params
        self.prompt_ids = list(prompt_ids)
        self.context = self.prompt_ids + list(resumed_ids)  # committed: prompt + generated; the last is the next root
        self.num_opened = len(self.context)  # what prefill puts in the cache (all but the last of these)
        self.version = 0  # bumped at every commit; drafts name the version they were built on
        self.eos_ids = frozenset() if params.ignore_eos else eos_ids
        self.generator = None if params.greedy else make_generator(self._step_seed(), runner.device)
        self.text = TextStream(tokenizer, params.stop)
        if resumed_ids:  # their text was sent by the target that generated them
            self.text.push(list(resumed_ids))
        # room for every token it may commit plus one verify forward's rows (a static cache never grows then)
        self.cache = runner.new_cache(len(self.prompt_ids) + params.max_new_tokens + runner.max_rows)
        self.cache_lender = None  # a BatchCache holding this cache stacked with others (cache is None then)
        self.finish_reason: str | None = None
        self.hidden: torch.Tensor | None = None  # [hidden] target feature at the last root (self-drafting heads)
        # keep_features: the target feature of every cached position, in cache order, as chunks
        # [rows, hidden] (an EAGLE-style head runs its own layer over all of them); off by default.
        self.feature_chunks: list[torch.Tensor] | None = [] if keep_features else None
        self.num_prefilled = 0  # opened tokens in the cache; the cache holds every committed token but the last
        self.prefill_s = 0.0
        if prefill:
            self.prefill_chunk()

    @property
    def prefilled(self) -> bool:
        return self.num_prefilled >= self.num_opened - 1

    def prefill_chunk(self, max_tokens: int | None = None) -> int:
        """Put the next prompt (and resumed) tokens in the cache (at most max_tokens; None = the rest);
        returns how many."""
        end = self.num_opened - 1
        start = time.perf_counter()
        prefixes = self.runner.prefix_cache if self.feature_chunks is None else None  # EAGLE reads every position
        if prefixes is not None and self.num_prefilled == 0 and end > 1:  # at least one token is still prefilled
            self.num_prefilled = prefixes.restore(self.context, self.cache, most=end - 1)
        if max_tokens is not None:
            end = min(end, self.num_prefilled + max_tokens)
        if end <= self.num_prefilled:
            return 0
        _, hidden = self.runner.forward(self.context[self.num_prefilled:end], self.cache, want_logits=False)
        self.hidden = hidden[-1].clone()  # its LM-head output predicts the root: what Medusa heads read first
        if self.feature_chunks is not None:
            self.feature_chunks.append(self.runner.features(hidden))
        num_tokens, self.num_prefilled = end - self.num_prefilled, end
        if prefixes is not None and self.prefilled:
            prefixes.insert(self.context[:end], self.cache)
        self.prefill_s += time.perf_counter() - start
        return num_tokens

    def _step_seed(self) -> int | None:
        """The seed of the next step's draws (None: unseeded, fresh entropy once)."""
        return None if self.params.seed is None else step_seed(self.params.seed, len(self.context))

    @property
    def generated_ids(self) -> list[int]:
        return self.text.token_ids

    @property
    def num_remaining(self) -> int:
        return self.params.max_new_tokens - len(self.text.token_ids)

    def verify(self, tree: DraftTree, layout: TreeLayout, logits: torch.Tensor,
               argmax: list[int] | None = None) -> VerifyResult:
        """logits: [rows, vocab] of the verify forward over [root] + tree (on the model's device);
        argmax: their argmax per row, already on the host (the step copies a batch's at once)."""
        if self.params.greedy:
            return verify_greedy(tree, layout, self.runner.greedy_ids(logits).tolist() if argmax is None else argmax)
        q = tree.q
        if q is not None and q.device != logits.device:  # a draft from the wire or another device's drafter
            tree = dataclasses.replace(tree, q=q.to(logits.device, non_blocking=True))
        return verify_sampling(tree, layout, WarpedRows(logits, self.params), self.generator)

    def commit_verified(self, tree: DraftTree, layout: TreeLayout, result: VerifyResult, hidden: torch.Tensor,
                        verify_s: float, features: torch.Tensor) -> StepResult:
        """Everything after the cache holds root + accepted path: features, version, tokens, stops.
        hidden [rows, H]: the verify forward's last hidden states; features [rows, F]: what a feature-reading
        head keeps (runner.features: hidden itself unless it reads fused layers)."""
        self.hidden = hidden[result.accepted_rows[-1] if result.accepted_rows else 0]
        if self.feature_chunks is not None:
            self.feature_chunks.append(features[[0, *result.accepted_rows]])  # [1 + accepted, F]
        self.version += 1
        return self._commit(list(result.token_ids), tree.num_nodes, result.num_accepted, max(layout.depths), verify_s)

    def _commit(self, token_ids: list[int], num_drafted: int, num_accepted: int, depth: int,
                verify_s: float) -> StepResult:
        token_ids = token_ids[:self.num_remaining]
        eos_at = next((i for i, t in enumerate(token_ids) if t in self.eos_ids), None)
        if eos_at is not None:
            token_ids = token_ids[:eos_at + 1]
            self.finish_reason = "eos"
        num_before = len(self.text.token_ids)
        delta = self.text.push(token_ids)
        token_ids = self.text.token_ids[num_before:]  # a stop string may cut the step short
        if self.text.stopped:
            self.finish_reason = "stop"
        elif self.finish_reason is None and self.num_remaining <= 0:
            self.finish_reason = "length"
        if self.finish_reason is not None:
            delta += self.text.flush()
        self.context.extend(token_ids)
        if self.generator is not None and self.params.seed is not None:
            self.generator.manual_seed(self._step_seed())
        return StepResult(token_ids, delta, num_drafted, num_accepted, depth, verify_s)
