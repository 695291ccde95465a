"""Drafting inside the target worker: the engine's own loop, for sequences no draft worker serves.

Medusa and EAGLE-style heads read the target's features, so they can only run here; prompt lookup
or a draft model may run here too (no draft worker needed). Same calls as `Engine.stream`: a
session per sequence, attached to its Sequence when it reads features, and a SpeculationController
choosing the depth from measured acceptance and costs.
"""
from __future__ import annotations

import time

from specdec.adaptive import AdaptiveConfig, SpeculationController
from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.engine import Engine
from specdec.load_aware import NO_CAP, draft_depth
from specdec.sequence import Sequence


class SelfDraft:
    """One sequence's in-target drafting state."""

    def __init__(self, engine: Engine, session):
        self.engine = engine
        self.session = session
        self.controller = SpeculationController(AdaptiveConfig(engine.config.num_speculative_tokens,
                                                               engine.config.adaptive))

    def propose(self, seq: Sequence, budget: int = NO_CAP) -> tuple[DraftTree, float]:
        """A draft for seq, as deep as the load-aware budget or else the controller says (draft_depth);
        returns (tree, seconds spent drafting)."""
        k = min(draft_depth(budget, self.controller.num_tokens(), self.engine.config.num_speculative_tokens),
                seq.num_remaining - 1, self.engine.max_len - len(seq.context) - 1)
        start = time.perf_counter()
        tree = self.session.propose(seq.context, k, seq.params, seq.generator) if k > 0 else DraftTree.empty()
        return tree, time.perf_counter() - start

    def record(self, step, draft_s: float) -> None:
        self.controller.record(step.depth, min(step.num_accepted, step.depth), draft_s + step.verify_s)


def open_sequence(engine: Engine, prompt_ids: list[int], params: SamplingParams) -> tuple[Sequence, SelfDraft | None]:
    """Prefill a Sequence; with an in-target drafter, also its drafting state."""
    if engine.drafter is None:
        return Sequence(engine.runner, prompt_ids, params, engine.tokenizer, engine.eos_ids), None
    session = engine.drafter.new_session()
    extra = {"keep_features": True} if getattr(session, "needs_features", False) else {}
    seq = Sequence(engine.runner, prompt_ids, params, engine.tokenizer, engine.eos_ids, **extra)
    if hasattr(session, "attach"):  # self-drafting heads read the target's features
        session.attach(seq)
    return seq, SelfDraft(engine, session)
