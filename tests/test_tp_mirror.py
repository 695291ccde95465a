"""The tensor-parallel target's bookkeeping in one process: a Follower fed what rank 0's Mirror sends
commits exactly rank 0's tokens (unseeded sampling with in-target drafts included) and holds no
sequence that rank 0 has let go of. The processes themselves are tested in e2e/test_tp_serving.py."""
from __future__ import annotations

import gc

import pytest

from specdec.batch_cache import BatchCache
from specdec.step import verify_step
from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.engine import Engine
from target_service.tp import Follower, Mirror, Stop

SAMPLED = SamplingParams(temperature=1.0, max_new_tokens=20, ignore_eos=True)  # unseeded
GREEDY = SamplingParams(max_new_tokens=20, ignore_eos=True)
PROMPT = [5, 6, 7, 5, 6, 7, 5, 6]


@pytest.fixture
def pair(tiny_target, one_thread):
    """(rank 0's engine with an ngram drafter, its active Mirror, a Follower fed synchronously)."""
    lead = Engine.from_pretrained(tiny_target, drafter="ngram", dtype="float32", adaptive=False)  # always drafts
    follower = Follower(Engine.from_pretrained(tiny_target, dtype="float32"))
    mirror = Mirror(active=True)
    mirror._send = follower.replay  # no collectives without a group: replaying first is the same
    return lead, mirror, follower


def admit(mirror: Mirror, lead, prompt, params, chunk_tokens: int = 3):
    """What TargetWorker does: open on every rank, then prefill chunk by chunk (mirrored)."""
    seq, draft = mirror.admit(lead, prompt, params)
    while not seq.prefilled:
        mirror.prefill(seq, chunk_tokens)
    return seq, draft


def step(mirror: Mirror, seqs, drafts) -> int:
    """What TargetWorker._step does: draft on rank 0, mirror, verify in one batch; returns nodes drafted."""
    trees = [draft.propose(seq.context, 4, seq.params, seq.generator) for seq, draft in zip(seqs, drafts)]
    mirror.step(seqs, trees)
    pool = BatchCache(seqs[0].runner)
    verify_step(seqs[0].runner, seqs, trees, pool)
    pool.release()  # the worker's pool lets go when the batch changes; here at once
    return sum(t.num_nodes for t in trees)


def test_follower_commits_rank0s_tokens_then_drops_finished(pair):
    lead, mirror, follower = pair
    opened = [admit(mirror, lead, PROMPT, params) for params in (SAMPLED, GREEDY)]
    seqs, drafts = [s for s, _ in opened], [d for _, d in opened]
    handles, num_drafted = sorted(follower.seqs), 0
    assert [follower.seqs[h].num_prefilled for h in handles] == [len(PROMPT) - 1] * 2  # rank 0's chunks, replayed
    # The sampled sequence is unseeded, so it may end steps before or after the greedy one: step the
    # live ones until both have ended.
    while any(s.finish_reason is None for s in seqs):
        live = [i for i, s in enumerate(seqs) if s.finish_reason is None]
        num_drafted += step(mirror, [seqs[i] for i in live], [drafts[i] for i in live])
        for i in live:
            if seqs[i].finish_reason is None:  # before the follower drops it at its end
                assert follower.seqs[handles[i]].generated_ids == seqs[i].generated_ids
    assert num_drafted > 0  # the follower verified rank 0's drafts, which it cannot draft itself
    assert follower.seqs == {}  # each dropped at its end, alike on every rank


def test_follower_drops_what_rank0_let_go_of_at_the_next_step(pair):
    lead, mirror, follower = pair
    kept, kept_draft = admit(mirror, lead, PROMPT, GREEDY)
    released, released_draft = admit(mirror, lead, [9, 8, 7], SAMPLED)
    step(mirror, [kept, released], [kept_draft, released_draft])
    del released, released_draft  # what TargetWorker.release leaves behind once the step is over
    gc.collect()
    assert len(follower.seqs) == 2
    step(mirror, [kept], [kept_draft])
    assert list(follower.seqs.values()) == [follower.seqs[mirror.handles[kept]]]
    assert follower.replay(Stop()) is False


def test_inactive_mirror_sends_nothing(tiny_target, one_thread):
    lead = Engine.from_pretrained(tiny_target, dtype="float32")
    mirror = Mirror()
    mirror._send = lambda op: pytest.fail(f"sent {op}")
    seq, draft = admit(mirror, lead, PROMPT, GREEDY)
    mirror.step([seq], [DraftTree.empty()])
    assert draft is None and len(seq.context) == len(PROMPT)


def test_a_follower_out_of_step_in_prefill_is_caught(pair):
    lead, mirror, follower = pair
    seq, _ = mirror.admit(lead, PROMPT, GREEDY)
    mirror.prefill(seq, 3)
    follower.seqs[mirror.handles[seq]].prefill_chunk(1)  # a follower that drifted
    with pytest.raises(RuntimeError, match="prefill diverged"):
        mirror.prefill(seq, 3)
