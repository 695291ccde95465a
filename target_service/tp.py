"""A tensor-parallel target worker: rank 0 serves gRPC, ranks >= 1 replay its model calls.

transformers splits the target over the torch.distributed group (`tp_plan="auto"`), so every forward
runs all-reduces that each rank must join with the same inputs. Rank 0 is the ordinary TargetWorker;
its `Mirror` sends each operation that touches the model (admit, a prefill chunk, a verify step) to
the followers just before running it, under the worker's `model_lock`, which already orders every
forward. A prompt is prefilled in the same chunks on every rank (each chunk names where it starts).
The followers (`follow`) keep their own table of Sequences and make the same calls. They decide
nothing themselves, so nothing that depends on timing or chance can differ between ranks:
- a step carries the final trees, however rank 0 drafted (draft worker, in-target drafter, adaptive
  depth) or trimmed them, so followers need no drafter;
- for a sampled sequence it also carries rank 0's generator state, so verification draws the same
  numbers everywhere (seeded or not, whatever drafting consumed on rank 0).
Followers drop a sequence once rank 0 lets go of its Sequence object (released, finished, refused
after prefill: a weakref finalizer sees them all); a step picked before a release still holds the
object, so nothing gone can be verified again. The drop rides on the next step. Finished sequences
end alike on every rank, so followers drop those at once.

Bounded failure: a rank that dies closes its sockets and the others' next collective raises at once;
a hung rank 0 is noticed after tp_group.COLLECTIVE_TIMEOUT_S (rank 0 sends a keep-alive while
idle, so only a hang reaches it); the launcher (tp_group) stops every rank when one ends.
"""
from __future__ import annotations

import logging
import queue
import signal
import threading
import time
import weakref
from dataclasses import dataclass, replace

import torch

from specdec.batch_cache import BatchCache
from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.errors import Unavailable
from specdec.rpc.server import freeze_heap
from specdec.sequence import Sequence
from specdec.step import verify_each
from target_service.self_draft import open_sequence

log = logging.getLogger(__name__)
KEEP_ALIVE_S = 30.0  # an idle rank 0 sends this often: idle followers never reach the collective timeout
STOP_WAIT_S = 15.0  # how long stop() waits for a forward in flight


@dataclass(frozen=True)
class Admit:
    handle: int  # rank 0's number for this admission (never reused, unlike sequence ids)
    prompt_ids: list[int]
    params: SamplingParams
    resumed_ids: list[int]  # a generation resumed from another target (Sequence's resumed_ids)


@dataclass(frozen=True)
class Prefill:
    handle: int
    start: int  # prompt tokens already prefilled on rank 0: a follower that differs is a bug
    max_tokens: int
    drops: list[int]  # as in Step


@dataclass(frozen=True)
class Step:
    handles: list[int]  # [B] the sequences verified together, in batch order
    trees: list[DraftTree]  # [B] final trees (q dropped for greedy sequences: verification ignores it)
    generator_states: list[torch.Tensor | None]  # [B] rank 0's generator state before the step; None = greedy
    roots: list[tuple[int, int]]  # [B] (context length, last token) on rank 0: a follower that differs is a bug
    drops: list[int]  # let go of on rank 0 before this step: drop after it


@dataclass(frozen=True)
class KeepAlive:
    pass


@dataclass(frozen=True)
class Stop:
    pass


class Mirror:
    """Rank 0's side. Inactive (one process) it only runs the local part; callers hold model_lock."""

    def __init__(self, active: bool = False):
        self.active = active
        self.handles: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # Sequence -> handle
        self.next_handle = 0
        # Handles whose Sequence rank 0 no longer holds. A SimpleQueue, because finalizers run wherever
        # the last reference goes (even inside a garbage collection), and its put never blocks.
        self.gone: queue.SimpleQueue = queue.SimpleQueue()
        self.model_lock: threading.Lock | None = None
        self.last_sent = time.monotonic()
        self.stopped = False

    def admit(self, engine, prompt_ids: list[int], params: SamplingParams, resumed_ids: list[int] = ()):
        """Open the sequence, unprefilled, on every rank; returns open_sequence's (Sequence, drafting
        session | None) for this one. Its prompt goes in through `prefill`."""
        if not self.active:
            return open_sequence(engine, prompt_ids, params, prefill=False, resumed_ids=resumed_ids)
        handle, self.next_handle = self.next_handle, self.next_handle + 1
        self._send(Admit(handle, list(prompt_ids), params, list(resumed_ids)))
        try:
            seq, session = open_sequence(engine, prompt_ids, params, prefill=False, resumed_ids=resumed_ids)
        except BaseException:
            self.gone.put(handle)
            raise
        self.handles[seq] = handle
        weakref.finalize(seq, self.gone.put, handle)
        return seq, session

    def prefill(self, seq: Sequence, max_tokens: int) -> int:
        """The next chunk of seq's prompt (at most max_tokens) on every rank; returns how many."""
        if self.active:
            self._send(Prefill(self.handles[seq], seq.num_prefilled, max_tokens, self._drops()))
        return seq.prefill_chunk(max_tokens)

    def step(self, seqs: list[Sequence], trees: list[DraftTree]) -> None:
        """Before the verify forward of seqs[i] with trees[i]: the followers run the same one."""
        if not self.active:
            return
        drops = self._drops()
        self._send(Step([self.handles[s] for s in seqs],
                        [replace(t, q=None) if s.generator is None else t for s, t in zip(seqs, trees)],
                        [None if s.generator is None else s.generator.get_state() for s in seqs],
                        [(len(s.context), s.context[-1]) for s in seqs], drops))

    def start(self, model_lock: threading.Lock) -> None:
        """Keep idle followers from timing out (the worker's lock orders this against forwards)."""
        self.model_lock = model_lock
        if self.active:
            threading.Thread(target=self._keep_alive, name="tp-keep-alive", daemon=True).start()

    def stop(self) -> None:
        """Tell the followers to exit (once the decode thread has stopped: nothing may follow Stop)."""
        if not self.active or self.model_lock is None:
            return
        if not self.model_lock.acquire(timeout=STOP_WAIT_S):
            log.error("tensor-parallel stop: the model is still busy; followers will time out instead")
            return
        try:
            if not self.stopped:
                self.stopped = True
                self._send(Stop())
        except Exception:  # noqa: BLE001 - a follower already gone: nothing left to stop
            log.warning("tensor-parallel stop: a follower is gone already")
        finally:
            self.model_lock.release()

    def _drops(self) -> list[int]:
        drops = []
        while not self.gone.empty():
            drops.append(self.gone.get_nowait())
        return drops

    def _keep_alive(self) -> None:
        while not self.stopped:
            time.sleep(max(0.1, self.last_sent + KEEP_ALIVE_S - time.monotonic()))
            with self.model_lock:
                if not self.stopped and time.monotonic() - self.last_sent >= KEEP_ALIVE_S:
                    self._send(KeepAlive())

    def _send(self, op) -> None:
        if self.stopped and not isinstance(op, Stop):
            raise Unavailable("target worker is stopping: its tensor-parallel followers are gone")
        torch.distributed.broadcast_object_list([op], src=0)
        self.last_sent = time.monotonic()


class Follower:
    """Rank >= 1's side: its own Sequences, keyed by rank 0's handles, driven by replayed operations."""

    def __init__(self, engine):
        self.engine = engine
        self.seqs: dict[int, Sequence] = {}
        self.batch_cache = BatchCache(engine.runner)  # as rank 0 keeps one: same shapes, same results

    def replay(self, op) -> bool:
        """Run one operation of rank 0's; False once told to stop."""
        if isinstance(op, Stop):
            return False
        if isinstance(op, Admit):
            engine = self.engine
            self.seqs[op.handle] = Sequence(engine.runner, op.prompt_ids, op.params, engine.tokenizer,
                                            engine.eos_ids, prefill=False, resumed_ids=op.resumed_ids)
        elif isinstance(op, Prefill):
            seq = self.seqs.get(op.handle)
            if seq is not None and seq.num_prefilled != op.start:  # would corrupt silently
                raise RuntimeError("a tensor-parallel follower's prefill diverged from rank 0's")
            try:
                if seq is not None:
                    seq.prefill_chunk(op.max_tokens)
            except Exception:  # noqa: BLE001 - rank 0 failed alike and lets go of it
                log.exception("prefill failed on this rank")
                self.seqs.pop(op.handle, None)
            for handle in op.drops:
                self.seqs.pop(handle, None)
        elif isinstance(op, Step):
            batch = [self.seqs[h] for h in op.handles]
            if [(len(s.context), s.context[-1]) for s in batch] != op.roots:  # would corrupt silently
                raise RuntimeError("a tensor-parallel follower's sequences diverged from rank 0's")
            for seq, state in zip(batch, op.generator_states):
                if state is not None:
                    seq.generator.set_state(state)
            verify_each(self.engine.runner, batch, op.trees, self.batch_cache)  # rank 0's very step
            for handle in [*op.drops, *(h for h, s in zip(op.handles, batch) if s.finish_reason is not None)]:
                self.seqs.pop(handle, None)
        return True


def follow(engine) -> int:
    """Ranks >= 1: replay rank 0's operations until Stop; a dead or hung rank 0 raises instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches rank 0 too; it stops us with Stop
    follower = Follower(engine)
    freeze_heap()  # this rank's model and state live as long as it does
    while True:
        box = [None]
        torch.distributed.broadcast_object_list(box, src=0)
        if not follower.replay(box[0]):
            return 0

