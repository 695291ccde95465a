"""Batch formation on the target worker: one step's sequences stay in one batch."""
from dataclasses import dataclass, field

from specdec.serving_config import TargetConfig
from target_service.batch_former import form_batch


@dataclass(eq=False)
class Link:
    alive: bool = True


@dataclass
class State:
    version_since: float
    pending: object = None
    draft_at: float = 0.0
    drafters: set = field(default_factory=lambda: {Link()})
    expect_drafts: bool = True
    missed: int = 0


CONFIG = TargetConfig(draft_wait_s=2.0, batch_wait_s=0.02, max_batch=8)


def drafts_expected(_):
    return True


def test_waits_briefly_for_the_other_drafts_of_a_step():
    seqs = {"a": State(10.0, pending="tree", draft_at=10.003), "b": State(10.0)}
    ids, wait_s = form_batch(seqs, drafts_expected, now=10.004, config=CONFIG, last_step_end=10.0)
    assert ids == [] and 0 < wait_s <= 0.02
    seqs["b"].pending, seqs["b"].draft_at = "tree", 10.006
    ids, _ = form_batch(seqs, drafts_expected, now=10.006, config=CONFIG, last_step_end=10.0)
    assert ids == ["a", "b"]


def test_a_late_draft_does_not_hold_the_step_past_the_window():
    seqs = {"a": State(10.0, pending="tree", draft_at=10.003), "b": State(10.0)}
    ids, _ = form_batch(seqs, drafts_expected, now=10.05, config=CONFIG, last_step_end=10.0)
    assert ids == ["a"] and seqs["b"].missed == 0


def test_out_of_phase_sequences_merge_after_the_next_step():
    # a has been ready for long (b stepped alone); b's commit just went out: wait for b's draft
    seqs = {"a": State(9.0, pending="tree", draft_at=9.5), "b": State(10.0)}
    ids, wait_s = form_batch(seqs, drafts_expected, now=10.001, config=CONFIG, last_step_end=10.0)
    assert ids == [] and wait_s <= 0.02


def test_no_draft_needed_means_ready_and_a_missed_draft_is_counted_once():
    seqs = {"a": State(10.0), "b": State(7.0)}
    ids, _ = form_batch(seqs, lambda seq_id: seq_id != "a", now=10.0, config=CONFIG)
    assert ids == ["b", "a"]  # longest waiting first; b's draft wait (2 s) has run out
    assert seqs["b"].missed == 1 and seqs["a"].missed == 0


def test_batch_is_capped():
    seqs = {str(i): State(float(i), pending="tree") for i in range(5)}
    config = TargetConfig(max_batch=3)
    ids, _ = form_batch(seqs, drafts_expected, now=100.0, config=config)
    assert ids == ["0", "1", "2"]


def test_a_promised_drafter_without_a_stream_gets_one_wait_only():
    """Expected drafts, but no live stream (not connected yet, or dead): one draft_wait_s, never two."""
    seqs = {"a": State(10.0, drafters=set())}
    ids, wait_s = form_batch(seqs, drafts_expected, now=10.5, config=CONFIG)
    assert ids == [] and 0 < wait_s <= 1.5  # the first wait: the drafter may still be connecting
    ids, _ = form_batch(seqs, drafts_expected, now=12.0, config=CONFIG)
    assert ids == ["a"] and seqs["a"].missed == 1
    seqs["a"].version_since = 12.1  # the next step: nobody came, so nobody is waited for
    ids, _ = form_batch(seqs, drafts_expected, now=12.1, config=CONFIG)
    assert ids == ["a"]
    seqs["a"].drafters = {Link()}  # a live drafter is waited for again, up to max_missed_drafts
    ids, _ = form_batch(seqs, drafts_expected, now=12.2, config=CONFIG)
    assert ids == []
