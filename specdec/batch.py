"""Continuous batching in process: many sequences decode together, one verify forward a step.

The step itself (drafting within the policy's budget, choosing what to verify, the padded forward,
the commit) is `specdec.step.decode_step`, the same one the engine runs for a single sequence.
"""
from __future__ import annotations

from specdec.batch_cache import BatchCache
from specdec.sequence import Sequence
from specdec.step import Drafting, StepFailure, decode_step


def generate_batch(engine, prompts: list, params, max_batch: int = 8, chat: bool = False,
                   load_aware: bool = True, steps: list | None = None) -> list[list[int]]:
    """Up to max_batch sequences step together; a finished sequence leaves and the next prompt joins
    between steps. Each sequence's depth comes from the speculation policy, whose load-aware node
    budget decides what pays at this batch size, starting from the step costs the engine's last
    generation or batch run measured. Returns each prompt's generated token ids; `steps`, if given,
    receives every sequence's StepResult (drafted and accepted counts)."""
    policy = engine.new_policy(load_aware=load_aware)  # from the step costs the engine's last run measured
    pool = BatchCache(engine.runner)
    queue = list(enumerate(prompts))
    active: list[Drafting] = []
    outputs: dict[str, list[int]] = {}
    while queue or active:
        while queue and len(active) < max_batch:
            index, prompt = queue.pop(0)
            session = engine.drafter.new_session() if engine.drafter is not None else None
            seq = Sequence(engine.runner, engine.encode(prompt, chat), params, engine.tokenizer, engine.eos_ids,
                           keep_features=bool(getattr(session, "needs_features", False)))
            if hasattr(session, "attach"):
                session.attach(seq)
            active.append(Drafting(str(index), seq, session))
            policy.add(str(index))
        _, results, _ = decode_step(engine.runner, policy, pool, active, engine.max_len)
        for entry, result in zip(active, results):
            if isinstance(result, StepFailure):
                raise RuntimeError(result.reason)
            if steps is not None:
                steps.append(result)
            if entry.seq.finish_reason is not None:
                outputs[entry.key] = list(entry.seq.generated_ids)
                policy.remove(entry.key)
                if hasattr(entry.session, "close"):  # drafters that learn from finished generations (suffix)
                    entry.session.close(entry.seq.context, len(entry.seq.prompt_ids))
        active = [e for e in active if e.seq.finish_reason is None]
    engine.last_policy = policy
    return [outputs[str(i)] for i in range(len(prompts))]
