"""Opening a sequence on the target: prefill, plus its in-target drafting session when the worker
has a drafter. Medusa and EAGLE-style heads read the target's features, so they can only run here;
prompt lookup or a draft model may run here too (no draft worker needed). Drafting itself is the
shared decode step's (specdec.step), with budgets from the worker's speculation policy."""
from __future__ import annotations

from specdec.core.types import SamplingParams
from specdec.engine import Engine
from specdec.sequence import Sequence


def open_sequence(engine: Engine, prompt_ids: list[int], params: SamplingParams,
                  prefill: bool = True, resumed_ids: list[int] = ()) -> tuple[Sequence, object | None]:
    """A Sequence (prefilled, or left for `prefill_chunk`); with an in-target drafter, also its drafting
    session (attached if it reads features: heads read them lazily, once the sequence decodes).
    resumed_ids: a generation another target began (see Sequence)."""
    extra = {"resumed_ids": resumed_ids} if resumed_ids else {}
    if engine.drafter is None:
        return Sequence(engine.runner, prompt_ids, params, engine.tokenizer, engine.eos_ids, prefill=prefill,
                        **extra), None
    session = engine.drafter.new_session()
    if getattr(session, "needs_features", False):
        extra["keep_features"] = True
    seq = Sequence(engine.runner, prompt_ids, params, engine.tokenizer, engine.eos_ids, prefill=prefill, **extra)
    if hasattr(session, "attach"):  # self-drafting heads read the target's features
        session.attach(seq)
    return seq, session
