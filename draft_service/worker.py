"""The draft worker: one drafting thread serving many sequences, pipelined.

Per sequence it mirrors the committed context and version from the target's commits. After sending
the draft for version v it at once drafts for version v+1 *assuming* step v accepts the path of
first children plus the drafter's own guess of the bonus token (`prepared`). When the commit for v
says exactly that, the prepared draft goes out with no drafting latency; otherwise it is thrown
away and a fresh draft is built on what was committed. A stale refusal carries the target's whole
context, from which the session resynchronises (drafter sessions keep the matching prefix of their
state), so a late join, a missed commit or a restart all take the same path.

Pipelining never changes the output distribution: a prepared draft is used only when its assumed
context is the committed one, and its tokens were drawn from q given exactly that context.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from dataclasses import dataclass, field

import torch

from specdec.core.sampling import make_generator
from specdec.core.tree import DraftTree
from specdec.core.types import SamplingParams
from specdec.errors import InvalidArgument, PermissionDenied, Unavailable
from specdec.keys import key_matches
from specdec.policy import DraftBudget, PolicyConfig, SpeculationPolicy
from specdec.rpc.trees import tree_to_pb
from specdec.rpc.v1 import target_pb2
from specdec.serving_config import DraftConfig
from specdec.telemetry import Telemetry
from specdec.telemetry_trace import DraftInstruments, draft_span
from draft_service.link import TargetLink

log = logging.getLogger(__name__)
Refusal = target_pb2.Refusal


def first_path(tree: DraftTree) -> list[int]:
    """Tokens along the first child of every node from the root: what 'all accepted' means for a tree."""
    path, node = [], -1
    while True:
        child = next((i for i, p in enumerate(tree.parent_ids) if p == node), None)
        if child is None:
            return path
        path.append(tree.token_ids[child])
        node = child


def split_first(tree: DraftTree) -> tuple[int, DraftTree]:
    """(node 0's token, the subtree under node 0 re-rooted): a guess plus a draft continuing it."""
    keep = [0]
    for i in range(1, tree.num_nodes):
        if tree.parent_ids[i] in keep:
            keep.append(i)
    nodes = keep[1:]
    index = {node: i for i, node in enumerate(nodes)}
    parents = tuple(-1 if tree.parent_ids[n] == 0 else index[tree.parent_ids[n]] for n in nodes)
    q = tree.q[nodes] if tree.q is not None and nodes else None
    return tree.token_ids[0], DraftTree(tuple(tree.token_ids[n] for n in nodes), parents, q)


@dataclass
class DraftSeq:
    seq_id: str
    link: TargetLink
    params: SamplingParams
    context: list[int]
    session: object
    generator: torch.Generator | None
    deadline: float
    prompt_len: int = 0
    version: int = 0
    synced_at: float = field(default_factory=time.monotonic)  # when we learned the current version
    sent: tuple[int, int, float] | None = None  # (version, depth, synced_at) of the last draft sent
    # (assumed commit, draft for the version after it, its `drafted`)
    prepared: tuple[list[int], DraftTree, tuple] | None = None
    num_drafts: int = field(default=0)
    max_tokens: int | None = None  # the target's load-aware budget from the last commit (None = no limit)
    drafted: tuple[float, float, int] = (0.0, 0.0, 0)  # the last draft: (time.monotonic() start, seconds, depth)
    trace_parent: object | None = None  # the Attach call's trace context: parent of its draft spans
    owner_key: str = ""  # Release must present it (specdec.keys); "" = anyone
    draft_key: str = ""  # sent with every draft: the target verifies drafts only from the attached worker

    def budget(self, policy: SpeculationPolicy, ahead: int = 0) -> DraftBudget:
        """What to draft for the next step, `ahead` tokens past the committed context: the policy's
        depth, within the node budget the target announced with its last commit."""
        remaining = self.params.max_new_tokens - (len(self.context) - self.prompt_len) - ahead
        return policy.plan(self.seq_id, remaining - 1, cap=self.max_tokens)


class DraftWorker:
    def __init__(self, drafter, config: DraftConfig, telemetry: Telemetry | None = None):
        self.drafter = drafter
        # sampling generators live where the draft model's q does (n-gram drafters have no model: the CPU)
        self.device = getattr(getattr(drafter, "runner", None), "device", "cpu")
        self.config = config
        self.telemetry = telemetry or Telemetry.off()
        self.lock = threading.Lock()
        self.seqs: dict[str, DraftSeq] = {}
        self.links: dict[str, TargetLink] = {}
        self.events: queue.Queue = queue.Queue()
        self.num_served = 0
        self.draining = False  # SIGTERM: attach nothing new, draft on for the attached sequences
        # acceptance and depth per sequence; the target's announced budget caps it (load-aware there)
        self.policy = SpeculationPolicy(PolicyConfig(max_depth=config.num_speculative_tokens,
                                                     adaptive=config.adaptive, load_aware=False))
        self.instruments = DraftInstruments(self.telemetry.metrics, lambda: len(self.seqs))
        self.thread = threading.Thread(target=self._loop, name="drafting", daemon=True)
        self.thread.start()

    # -- calls from the servicer and the links ------------------------------------------------
    def attach(self, seq_id: str, target: str, prompt_ids: list[int], params: SamplingParams, timeout_s: float,
               owner_key: str = "", draft_key: str = ""):
        with self.lock:
            if self.draining:
                raise Unavailable("draft worker is draining (shutting down): the target decodes without it")
            if seq_id in self.seqs:  # another caller's sequence is not taken over (nor its target changed)
                raise InvalidArgument(f"sequence {seq_id!r} is already attached")
            link = self.links.get(target)
            if link is None or not link.alive:
                link = self.links[target] = TargetLink(target, self._on_message, self._on_lost, self.config.security)
            self.policy.add(seq_id)
            self.seqs[seq_id] = DraftSeq(
                seq_id, link, params, list(prompt_ids), self.drafter.new_session(),
                None if params.greedy else make_generator(None, self.device),
                time.monotonic() + timeout_s if timeout_s > 0 else float("inf"), prompt_len=len(prompt_ids),
                trace_parent=self.telemetry.current_context(), owner_key=owner_key, draft_key=draft_key)
        self.events.put(("start", seq_id))

    def release(self, seq_id: str, owner_key: str | None = None) -> bool:
        """Stop drafting for the sequence; a caller's Release passes `owner_key`, which must be the
        sequence's (PERMISSION_DENIED otherwise). None: the worker itself."""
        with self.lock:
            held = self.seqs.get(seq_id)
            if held is not None and owner_key is not None and not key_matches(held.owner_key, owner_key):
                raise PermissionDenied(f"sequence {seq_id!r} belongs to another client: only the caller that "
                                       f"attached it may release it")
            seq = self.seqs.pop(seq_id, None)
            self.policy.remove(seq_id)
            self.num_served += seq is not None
        if seq is not None and hasattr(seq.session, "close"):  # drafters that learn from finished generations
            seq.session.close(seq.context, seq.prompt_len)
        return seq is not None

    def begin_drain(self) -> None:
        with self.lock:
            self.draining = True

    def num_running(self) -> int:
        with self.lock:
            return len(self.seqs)

    def info(self) -> tuple[list[str], int]:
        with self.lock:
            return sorted(self.seqs), self.num_served

    def stop(self) -> None:
        self.events.put(None)
        with self.lock:
            for link in self.links.values():
                link.close()

    def _on_message(self, link: TargetLink, message: target_pb2.VerifyMessage) -> None:
        self.events.put(("message", message))

    def _on_lost(self, link: TargetLink) -> None:
        with self.lock:
            if self.links.get(link.address) is link:
                del self.links[link.address]
            for seq_id in [s for s, seq in self.seqs.items() if seq.link is link]:
                del self.seqs[seq_id]
                self.num_served += 1

    # -- the drafting thread ------------------------------------------------------------------
    def _loop(self) -> None:
        while True:
            event = self.events.get()
            if event is None:
                return
            kind, payload = event
            seq_id = payload if kind == "start" else payload.sequence_id
            with self.lock:
                seq = self.seqs.get(seq_id)
                expired = [s for s, q in self.seqs.items() if q.deadline < time.monotonic()]
            for s in expired:
                self.release(s)
            if seq is None or seq_id in expired:
                continue
            try:
                if kind == "start":
                    self._send_fresh(seq)
                elif payload.HasField("commit"):
                    self._on_commit(seq, payload.commit)
                else:
                    self._on_refusal(seq, payload.refusal)
            except Exception:  # noqa: BLE001 - a drafting bug costs this sequence its drafts, nothing more
                log.exception("drafting failed for %s", seq_id)
                self.release(seq_id)

    def _on_commit(self, seq: DraftSeq, commit: target_pb2.Commit) -> None:
        # the version the tokens follow: the one before, or further back for a commit that catches up the
        # steps of a zero budget (the target holds their tokens back until we may draft again)
        base = commit.base_version if commit.HasField("base_version") else commit.version - 1
        if commit.finish_reason:
            if base == seq.version:  # the last tokens too, for drafters that keep the output
                seq.context.extend(commit.token_ids)
            self.release(seq.seq_id)
            return
        if commit.version <= seq.version:
            return  # already known from a refusal's context
        seq.max_tokens = commit.draft_budget if commit.HasField("draft_budget") else None
        if base != seq.version:  # we missed commits (joined late, a link broke): ask
            seq.prepared = None
            self._send(seq, DraftTree.empty())
            return
        tokens = list(commit.token_ids)
        seq.context.extend(tokens)
        seq.version = commit.version
        verified = base == commit.version - 1 and seq.sent is not None and seq.sent[0] == base and (
            commit.num_drafted > 0 or seq.sent[1] == 0)  # else the target stepped without our draft
        if verified:
            depth = seq.sent[1]
            # the step's cost on the critical path: from learning version v - 1 to learning v
            self.policy.observe(seq.seq_id, depth, min(commit.num_accepted, depth), time.monotonic() - seq.sent[2])
        seq.synced_at = time.monotonic()
        prepared, seq.prepared = seq.prepared, None
        if prepared is not None and prepared[0] == tokens and seq.max_tokens != 0:
            self._send(seq, prepared[1], prepared[2], pipelined=True)
            self._prepare(seq, prepared[1])
        else:
            self._send_fresh(seq)

    def _on_refusal(self, seq: DraftSeq, refusal: target_pb2.Refusal) -> None:
        if refusal.kind == Refusal.STALE and refusal.current_version <= seq.version:
            return  # a commit already brought us there (and we drafted on it)
        seq.prepared = None
        if refusal.kind == Refusal.STALE:
            seq.context, seq.version = list(refusal.context_ids), refusal.current_version
            seq.synced_at = time.monotonic()
            self._send_fresh(seq)
        elif refusal.kind in (Refusal.UNKNOWN_SEQUENCE, Refusal.NOT_ATTACHED):
            if refusal.kind == Refusal.NOT_ATTACHED:
                log.warning("target refused drafts for %s: %s", seq.seq_id, refusal.reason)
            self.release(seq.seq_id)
        else:  # malformed: a drafter bug; the target decodes on alone and the next commit restarts us
            log.warning("draft for %s refused: %s", seq.seq_id, refusal.reason)

    def _send_fresh(self, seq: DraftSeq) -> None:
        if seq.max_tokens == 0:
            return  # under load the target verifies no drafts next step and does not wait for one
        tree = self._propose(seq, seq.context, seq.budget(self.policy))
        self._send(seq, tree, seq.drafted)
        self._prepare(seq, tree)

    def _prepare(self, seq: DraftSeq, sent: DraftTree) -> None:
        """Pipelining: draft for the next version assuming `sent` is accepted along its first path."""
        if not self.config.pipeline:
            return
        path = first_path(sent)
        budget = seq.budget(self.policy, ahead=len(path) + 1)
        # the prepared draft is used only if the whole path and the guessed bonus are accepted
        if budget.depth <= 0 or self.policy.alpha(seq.seq_id) ** (len(path) + 1) < self.config.pipeline_min_hit:
            return
        # one node more, the guessed bonus; the target cuts the rest to the budget it announces then
        max_nodes = None if budget.max_nodes is None else budget.max_nodes + 1
        ahead = self._propose(seq, seq.context + path, DraftBudget(budget.depth + 1, max_nodes))
        if ahead.num_nodes == 0:
            return
        guess, tree = split_first(ahead)
        seq.prepared = (path + [guess], tree, seq.drafted)

    def _propose(self, seq: DraftSeq, context: list[int], budget: DraftBudget) -> DraftTree:
        start = time.monotonic()
        if budget.depth <= 0:
            seq.drafted = (start, 0.0, 0)
            return DraftTree.empty()
        tree = seq.session.propose(context, budget.depth, seq.params, seq.generator, max_nodes=budget.max_nodes)
        seq.drafted = (start, time.monotonic() - start, budget.depth)
        return tree

    def _send(self, seq: DraftSeq, tree: DraftTree, drafted: tuple | None = None, pipelined: bool = False) -> None:
        """drafted: (start, seconds, depth asked) of the drafting that made `tree` (None: not drafted)."""
        depth = len(first_path(tree)) if tree.num_nodes else 0
        seq.sent = (seq.version, depth, seq.synced_at)
        seq.num_drafts += 1
        message = target_pb2.DraftMessage(sequence_id=seq.seq_id, version=seq.version, tree=tree_to_pb(tree),
                                          draft_key=seq.draft_key)
        if drafted is not None:
            self.instruments.sent(drafted[1], pipelined)
            if self.telemetry.tracing:  # the step this draft is for is version + 1
                message.trace_context.update(draft_span(self.telemetry, seq.trace_parent, seq.version + 1, *drafted,
                                                        tree.num_nodes, pipelined))
        seq.link.send(message)
