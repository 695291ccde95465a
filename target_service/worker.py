"""The target worker's state and its one decoding thread.

Sequences are driven through `specdec.sequence.Sequence`, the very step the in-process engine uses,
so greedy output over gRPC equals the engine's token for token. Per sequence the worker keeps at
most one pending draft, for the current version only: a draft on an older version is refused with
the committed state (the drafter resynchronises), a malformed one is refused with a reason before
it can touch the cache. A step runs as soon as its draft is in, or when the drafters have had
`draft_wait_s` (or none is alive): a dead or slow draft worker costs speed, never correctness.

All forwards run on one thread (`_loop`) under `model_lock`, so torch never runs two at once.
An admitted sequence is prefilled there too, `prefill_chunk_tokens` at a time, one chunk after each
decode step: a long prompt slows the running streams by a chunk per step instead of stopping them
for its whole prefill. Its stream's first message (version 0) goes out when its prefill is done.
"""
from __future__ import annotations

import logging
import threading
import time

from specdec.batch_cache import BatchCache
from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.engine import Engine
from specdec.errors import Internal, InvalidArgument, PermissionDenied, Unavailable
from specdec.keys import key_matches
from specdec.kv_budget import KvBudget
from specdec.kv_budget import plan as plan_kv_budget
from specdec.policy import NO_CAP, is_sampled
from specdec.policy.calibrate import forward_costs
from specdec.rpc.v1 import target_pb2
from specdec.serving_config import TargetConfig
from specdec.step import Drafting, StepFailure, StepTimes, plan_all, propose_all, verify_timed
from specdec.telemetry import GEN_AI_INPUT_TOKENS, SPAN_PREFILL, Telemetry
from specdec.telemetry_trace import TargetInstruments, TargetStepTrace
from target_service.batch_former import form_batch
from target_service.kv_room import KvFigures, KvRoom
from target_service.draft_intake import DraftIntake
from target_service.seq_state import DrafterLink, SeqState, check_resumed
from target_service.tp import Mirror

log = logging.getLogger(__name__)
Refusal = target_pb2.Refusal
ADMIT_WAIT_S = 1.0  # the most a decode turn waits for admissions opening their sequences


class TargetWorker(DraftIntake):
    """fault(point, seq_ids): a test hook called at "loop" (each decode-loop turn that steps), "verify"
    (each verify attempt, with its sequences, after the forward and just before the commit) and
    "prefill" (each prefill chunk, with its sequence); whatever it raises is handled as a real fault there."""

    def __init__(self, engine: Engine, config: TargetConfig, mirror: Mirror | None = None, fault=None,
                 telemetry: Telemetry | None = None, kv_budget: KvBudget | None = None):
        self.engine = engine
        self.telemetry = telemetry or Telemetry.off()
        self.fault = fault
        self.broken: str | None = None  # why the decode loop stopped (health NOT_SERVING from then on)
        self.on_broken = lambda: None  # the server turns health NOT_SERVING
        self.config = config
        self.cond = threading.Condition()
        self.model_lock = threading.Lock()
        self.mirror = mirror or Mirror()  # tensor-parallel followers replay every model call (none at tp 1)
        self.seqs: dict[str, SeqState] = {}
        self.links: set[DrafterLink] = set()  # open Verify streams
        self.num_served = 0
        self.num_verify_forwards = self.num_sequence_steps = self.max_batch_seen = 0  # batching figures
        # under cond; a load-aware budget starts from measured verify costs (not under tp: every model call
        # there is mirrored to the followers)
        costs = forward_costs(engine.runner) if config.load_aware and config.tp == 1 else ()
        self.policy = engine.new_policy(load_aware=config.load_aware, costs=costs)
        self.last_step_end = 0.0  # monotonic time the last verify step ended (batch formation)
        self.draft_wait_s = 0.0  # decode thread: seconds waited for drafts since the last step
        self.batch_cache = BatchCache(engine.runner)  # the last batch's stacked KV cache (decode thread only)
        # KV budget, under cond: from the GPU's memory there, else configured or every slot at full context
        self.kv_budget = kv_budget or plan_kv_budget(engine, config.max_sequences, config.max_kv_tokens,
                                                     config.max_batch, config.gpu_memory_fraction, config.tp)
        self.kv = KvRoom(self.kv_budget.capacity_tokens, config.max_sequences)
        self.instruments = TargetInstruments(self.telemetry.metrics, self.kv_figures)
        # under cond: admissions that asked for model_lock, and those that are done with it (the loop lets
        # the ones waiting at the start of its turn in first; later ones wait for the next turn)
        self.num_admissions_begun = self.num_admissions_done = 0
        self.stopped = False
        self.draining = False  # SIGTERM: no new sequences, the running ones finish
        self.thread = threading.Thread(target=self._loop, name="target-decode", daemon=True)
        self.thread.start()

    # -- calls from the servicer ------------------------------------------------------------
    def admit(self, seq_id: str, prompt_ids: list[int], params: SamplingParams, expect_drafts: bool,
              owner_key: str = "", draft_key: str = "", resumed_ids: list[int] = ()) -> SeqState:
        """owner_key: what Release must present; draft_key: what every draft must carry (specdec.keys);
        resumed_ids: tokens of this generation committed by a target that failed (router failover)."""
        prompt_ids = self.engine.encode(prompt_ids)  # validates ids against the vocabulary
        if len(prompt_ids) + params.max_new_tokens > self.engine.max_len:
            raise InvalidArgument(f"prompt ({len(prompt_ids)} tokens) plus max_new_tokens ({params.max_new_tokens}) "
                                  f"exceeds the model's context of {self.engine.max_len} tokens")
        check_resumed(resumed_ids, params, self.engine.runner.vocab_size)
        kv_tokens = self.kv.check_possible(len(prompt_ids), params.max_new_tokens)
        with self.cond:
            if self.broken is not None:
                raise Unavailable(f"target worker cannot decode: {self.broken}")
            if self.draining:
                raise Unavailable("target worker is draining (shutting down): admit the sequence elsewhere")
            if seq_id in self.seqs:
                raise InvalidArgument(f"sequence {seq_id!r} is already admitted")
            self.kv.check_room(self.seqs, kv_tokens)
            self.num_admissions_begun += 1
        try:
            with self.model_lock:  # opened (not prefilled yet) on every tensor-parallel rank
                seq, session = self.mirror.admit(self.engine, prompt_ids, params, resumed_ids)
        finally:
            with self.cond:
                self.num_admissions_done += 1
                self.cond.notify_all()
        state = SeqState(seq, expect_drafts and session is None, session=session,
                         version=seq.version, context_len=len(seq.context), kv_tokens=kv_tokens,
                         trace_parent=self.telemetry.current_context(), owner_key=owner_key, draft_key=draft_key)
        with self.cond:  # again: a concurrent admission may have taken the room or the id, or the loop died
            if self.broken is not None:  # _break ended the streams it held; this one would wait forever
                raise Unavailable(f"target worker cannot decode: {self.broken}")
            if seq_id in self.seqs:
                raise InvalidArgument(f"sequence {seq_id!r} is already admitted")
            self.kv.check_room(self.seqs, kv_tokens)
            self.seqs[seq_id] = state
            self.cond.notify_all()  # the decode loop prefills it
        return state

    def release(self, seq_id: str, owner_key: str | None = None) -> bool:
        """Drop the sequence; a caller's Release passes `owner_key`, which must be the sequence's
        (PERMISSION_DENIED otherwise). None: the worker itself (its Admit call ended)."""
        with self.cond:
            state = self.seqs.get(seq_id)
            if state is None:
                return False
            if owner_key is not None and not key_matches(state.owner_key, owner_key):
                raise PermissionDenied(f"sequence {seq_id!r} belongs to another client: only the caller that "
                                       f"admitted it may release it")
            del self.seqs[seq_id]
            self.policy.remove(seq_id)
            self.num_served += 1
        state.outbox.put(None)
        return True

    def begin_drain(self) -> None:
        """Admit nothing new (UNAVAILABLE); the sequences held decode on to their end."""
        with self.cond:
            self.draining = True

    def num_running(self) -> int:
        with self.cond:
            return len(self.seqs)

    def info(self) -> tuple[list[str], int]:
        with self.cond:
            return sorted(self.seqs), self.num_served

    def kv_figures(self) -> KvFigures:
        with self.cond:
            return self.kv.figures(self.seqs)

    def stop(self) -> None:
        with self.cond:
            self.stopped = True
            self.cond.notify_all()
        self.thread.join(timeout=5.0)

    # -- the decoding thread ------------------------------------------------------------------
    def _pick(self, idle_wait: bool = True) -> list[tuple[str, SeqState, DraftTree | None]]:
        """Up to max_batch ready sequences (those waiting longest first), or [] (after waiting, if idle_wait)."""
        decoding = {seq_id: state for seq_id, state in self.seqs.items() if not state.prefilling}
        ids, wait_s = form_batch(decoding, self._needs_draft, time.monotonic(), self.config, self.last_step_end)
        if not ids and idle_wait:
            began = time.monotonic()
            self.cond.wait(timeout=wait_s)
            if decoding:  # sequences were there, waiting for their drafts: a cost of speculating
                self.draft_wait_s += time.monotonic() - began
        picked = []
        for seq_id in ids:
            state = self.seqs[seq_id]
            tree, state.pending = state.pending, None
            picked.append((seq_id, state, tree))
        return picked

    def _needs_draft(self, seq_id: str) -> bool:
        """Whether the sequence's next step waits for a draft worker's draft."""
        return self.seqs[seq_id].session is None and self.policy.cap() != 0

    def _loop(self) -> None:
        """Each turn: one decode step of the ready sequences, then one prefill chunk (if any is waiting)."""
        while True:
            with self.cond:
                # a lock is not fair: taken again right after each step, it could keep an admission out
                # until every running sequence ends. Opening a sequence is quick; let those waiting in first.
                due = self.num_admissions_begun
                self.cond.wait_for(lambda: self.stopped or self.num_admissions_done >= due, timeout=ADMIT_WAIT_S)
                if self.stopped:
                    return
                prefilling = min(((i, s) for i, s in self.seqs.items() if s.prefilling),
                                 key=lambda item: item[1].admitted_at, default=None)
                picked = self._pick(idle_wait=prefilling is None)
            try:
                if picked:
                    if self.fault is not None:
                        self.fault("loop", [seq_id for seq_id, _, _ in picked])
                    self._step(picked)
                if prefilling is not None:
                    self._prefill(*prefilling)
            except Exception as exc:  # noqa: BLE001 - the loop cannot go on: say so, end every stream
                log.exception("the decode loop stopped")
                self._break(f"decode loop stopped: {type(exc).__name__}: {exc}")
                return

    def _prefill(self, seq_id: str, state: SeqState) -> None:
        """One chunk of the sequence's prompt; once all of it is in, it decodes from the next turn on and
        its stream says so (version 0). A chunk that fails fails this sequence alone (INTERNAL)."""
        seq = state.seq
        try:
            if self.fault is not None:
                self.fault("prefill", [seq_id])
            with self.telemetry.span(SPAN_PREFILL, parent=state.trace_parent,
                                     attributes={GEN_AI_INPUT_TOKENS: len(seq.prompt_ids)}), self.model_lock:
                self.mirror.prefill(seq, self.config.prefill_chunk_tokens)  # a span per chunk
        except Exception as exc:  # noqa: BLE001
            log.exception("prefill failed for %s", seq_id)
            return self._fail(seq_id, state, Internal(f"sequence {seq_id}: prefill failed: {exc}"))
        if not seq.prefilled:
            return None
        with self.cond:
            if self.seqs.get(seq_id) is not state:  # released meanwhile
                return None
            state.prefilling, state.version_since = False, time.monotonic()  # drafts are waited for from now
            self.policy.add(seq_id)
            self.policy.announce(seq_id)
            self.cond.notify_all()
        self.instruments.prefill_s.observe(seq.prefill_s)
        state.outbox.put(target_pb2.Commit(sequence_id=seq_id, version=0, prefill_s=seq.prefill_s))
        return None

    def _step(self, picked: list[tuple[str, SeqState, DraftTree | None]]) -> None:
        """One decode step of the picked sequences: in-target drafts, the policy's cut, one verify."""
        entries = [Drafting(seq_id, state.seq, state.session if tree is None else None, tree)
                   for seq_id, state, tree in picked]
        keys, seqs = [e.key for e in entries], [e.seq for e in entries]
        with self.model_lock:
            with self.cond:
                budgets = plan_all(self.policy, entries, self.engine.max_len)
                trace = self.telemetry.tracing and TargetStepTrace(self.telemetry, picked, self.policy.planned)
            trees, draft_s = propose_all(entries, budgets)
            with self.cond:  # load-aware: verify only as much as pays at this batch size
                trees = self.policy.allocate(keys, trees, [is_sampled(t, s.params.greedy) for t, s in zip(trees, seqs)])
            self.mirror.step(seqs, trees)  # tensor-parallel followers run the same forward
            self.num_verify_forwards += 1
            self.num_sequence_steps += len(seqs)
            self.max_batch_seen = max(self.max_batch_seen, len(seqs))
            ids = {id(seq): key for key, seq in zip(keys, seqs)}
            fault = None if self.fault is None else lambda batch: self.fault("verify", [ids[id(s)] for s in batch])
            start, times = time.perf_counter(), StepTimes()
            steps, timed = verify_timed(self.engine.runner, seqs, trees, self.batch_cache, fault, times)
            self.instruments.step(len(seqs), time.perf_counter() - start, steps)
            with self.cond:
                self.policy.record(keys, trees, [None if isinstance(s, StepFailure) else s for s in steps],
                                   time.perf_counter() - start, draft_s, self.draft_wait_s, timed=timed)
                self.draft_wait_s = 0.0
                self.last_step_end = time.monotonic()
        for (seq_id, state, _), step in zip(picked, steps):
            if isinstance(step, StepFailure):
                self._fail(seq_id, state, Internal(f"sequence {seq_id}: {step.reason}"))
                continue
            try:
                self._publish(seq_id, state, step)
            except Exception as exc:  # noqa: BLE001 - this sequence's commit message, nothing else
                log.exception("publishing failed for %s", seq_id)
                self._fail(seq_id, state, Internal(f"sequence {seq_id}: publishing failed: {exc}"))
        if trace:
            trace.finish(entries, trees, steps, times)

    def _fail(self, seq_id: str, state: SeqState, error: Exception) -> None:
        """End one sequence's stream with `error` and forget it."""
        with self.cond:
            if self.seqs.get(seq_id) is state:
                del self.seqs[seq_id]
                self.policy.remove(seq_id)
                self.num_served += 1
        state.outbox.put(error)

    def _break(self, reason: str) -> None:
        """The decode loop is gone: health NOT_SERVING, every stream UNAVAILABLE now, no admissions."""
        with self.cond:
            self.broken = reason
            states = list(self.seqs.items())
            self.seqs.clear()
        self.on_broken()
        for seq_id, state in states:
            state.outbox.put(Unavailable(f"sequence {seq_id}: target worker {reason}"))

    def _publish(self, seq_id: str, state: SeqState, step) -> None:
        seq = state.seq
        commit = target_pb2.Commit(sequence_id=seq_id, version=seq.version, token_ids=step.token_ids,
                                   text=step.text, num_drafted=step.num_drafted, num_accepted=step.num_accepted,
                                   verify_s=step.verify_s, finish_reason=seq.finish_reason or "")
        with self.cond:
            if self.seqs.get(seq_id) is not state:  # released while stepping
                return
            budget = self.policy.announce(seq_id)  # fixed before its next draft is made
            if budget != NO_CAP:
                commit.draft_budget = budget
                self.instruments.node_budget.observe(budget)
            state.version_since = time.monotonic()
            state.version, state.context_len = seq.version, len(seq.context)
            state.pending = None  # anything queued during the step was built on the old version
            if state.drafters:
                state.tell_drafters(seq_id, commit, None if budget == NO_CAP else budget)
            if seq.finish_reason is not None:
                del self.seqs[seq_id]
                self.policy.remove(seq_id)
                self.num_served += 1
        state.outbox.put(commit)
        if seq.finish_reason is not None:
            state.outbox.put(None)
            if hasattr(state.session, "close"):  # in-target drafters that learn from finished generations
                state.session.close(seq.context, len(seq.prompt_ids))  # on the decode thread, which drafts
