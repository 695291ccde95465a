"""Which sequences the next verify forward takes (batch formation on the target worker).

A sequence is ready when its draft is in, when it needs none (in-target drafting, or a load-aware
budget of 0), or when its drafters had their chance (`draft_wait_s`; after `max_missed_drafts`
misses in a row we stop waiting for them). A drafter that was promised but has no live stream here
(it has not connected yet, or it died) gets one `draft_wait_s`, never more: a dead draft worker
costs at most one wait. The sequences of one step get their commits together,
and their drafts come back a few milliseconds apart (one drafting thread serves them in turn). A
step that took the first ready sequence alone would split the batch for good: every later step
would find the sequences out of phase, and each would verify alone. So once one sequence is
ready (or the last step ended), the step waits up to `batch_wait_s` for the others' drafts, and
ends the wait the moment the last one arrives.
"""
from __future__ import annotations

from typing import Callable


def readiness(state, needs_draft: bool, now: float, config) -> tuple[bool, float]:
    """(ready, seconds until it will be ready anyway) for one SeqState."""
    if state.pending is not None or not needs_draft:
        return True, 0.0
    live = any(link.alive for link in state.drafters)
    if not live and (not state.expect_drafts or state.missed >= 1) or state.missed >= config.max_missed_drafts:
        return True, 0.0
    left = state.version_since + config.draft_wait_s - now
    return left <= 0, max(left, 0.0)


def form_batch(seqs: dict, needs_draft: Callable[[str], bool], now: float, config,
               last_step_end: float = 0.0) -> tuple[list[str], float]:
    """(ids of the sequences to verify now, longest waiting first; or [] and seconds to wait).

    The gathering window opens when the first sequence is ready or the last step ended, whichever
    is later: sequences that drifted out of phase merge again at the next step. Marks a sequence
    that steps without the draft it waited for (state.missed)."""
    ready, wait_s, first_ready = [], 0.5, None
    for seq_id, state in sorted(seqs.items(), key=lambda kv: kv[1].version_since):
        is_ready, left = readiness(state, needs_draft(seq_id), now, config)
        if is_ready:
            ready.append(seq_id)
            since = state.draft_at if state.pending is not None else state.version_since
            first_ready = since if first_ready is None else min(first_ready, since)
        else:
            wait_s = min(wait_s, left)
    waiting = len(ready) < len(seqs)
    if ready and waiting and len(ready) < config.max_batch:
        gather_left = max(first_ready, last_step_end) + config.batch_wait_s - now
        if gather_left > 0:
            return [], min(gather_left, wait_s)
    picked = ready[:config.max_batch]
    for seq_id in picked:
        state = seqs[seq_id]
        if state.pending is None and needs_draft(seq_id) and state.version_since + config.draft_wait_s <= now:
            state.missed += 1
    return picked, wait_s
