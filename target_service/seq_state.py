"""What the target worker holds per sequence and per draft worker stream, and how it judges a draft
before it can touch a cache."""
from __future__ import annotations

import queue
import time
from dataclasses import dataclass, field

from specdec.core.tree import DraftTree, tree_layout
from specdec.errors import InvalidArgument
from specdec.rpc.trees import tree_from_pb
from specdec.rpc.v1 import target_pb2
from specdec.sequence import Sequence

Refusal = target_pb2.Refusal


class DrafterLink:
    """One draft worker's Verify stream, as seen from here: an outbox of VerifyMessages."""

    def __init__(self) -> None:
        self.outbox: queue.Queue = queue.Queue()
        self.alive = True

    def send(self, message: target_pb2.VerifyMessage) -> None:
        if self.alive:
            self.outbox.put(message)


@dataclass
class SeqState:
    seq: Sequence
    expect_drafts: bool
    outbox: queue.Queue = field(default_factory=queue.Queue)  # Commits for the router; None ends the stream
    drafters: set = field(default_factory=set)  # live DrafterLinks that sent drafts for this sequence
    pending: DraftTree | None = None  # validated draft for seq.version
    draft_at: float = 0.0  # when `pending` arrived
    version_since: float = field(default_factory=time.monotonic)
    missed: int = 0  # steps in a row that waited in vain for a draft
    session: object | None = None  # in-target drafting session, when the worker has a drafter
    # The published state, under the worker's lock: seq.version / seq.context move during a step
    # (outside the lock), so drafts and refusals are judged against this snapshot instead.
    version: int = 0
    context_len: int = 0
    kv_tokens: int = 0  # KV cache reserved for this sequence (prompt + max_new_tokens), see KvRoom
    prefilling: bool = True  # its prompt is still going into the cache, chunk by chunk; not decoding yet
    admitted_at: float = field(default_factory=time.monotonic)  # prefill order: first come, first prefilled
    trace_parent: object | None = None  # the Admit call's trace context: parent of its step spans
    draft_trace: dict | None = None  # trace context of the draft span behind `pending`
    owner_key: str = ""  # Release must present it (specdec.keys); "" = anyone
    draft_key: str = ""  # every draft must carry it: only the attached draft worker drafts; "" = anyone
    # What the draft workers last heard: the version, and the budget it announced (None: no limit); the
    # tokens of the steps since, held back while the budget stays 0 (tell_drafters)
    drafters_version: int = 0
    drafters_budget: int | None = None
    unsent_ids: list = field(default_factory=list)

    def tell_drafters(self, seq_id: str, commit: target_pb2.Commit, budget: int | None) -> None:
        """The commit, for the sequence's draft workers. The first commit of budget 0 goes out (it tells
        them to stop drafting); while the budget stays 0 the steps' tokens are held back, and the next
        commit that lets them draft, or ends the sequence, carries them all (`base_version`). A message
        per sequence per step, for drafts nobody asked for, woke a draft worker process on the target's
        cores at every step (prompt lookup in a draft worker at 16 users: ~5% more tokens/s without
        them, in alternating runs; within the noise at 8). The worker is never out of step when it
        drafts: the commit before a probe carries the probe's budget, so its draft is made at once on
        the current version; a worker that joined late gets a catch-up it cannot place and asks, as
        for any missed commit."""
        if budget == 0 and self.drafters_budget == 0 and not commit.finish_reason:
            self.unsent_ids.extend(commit.token_ids)
            return
        message = commit
        if self.unsent_ids:
            message = target_pb2.Commit()
            message.CopyFrom(commit)
            message.base_version = self.drafters_version
            message.token_ids[:] = self.unsent_ids + list(commit.token_ids)
            self.unsent_ids = []
        self.drafters_version, self.drafters_budget = commit.version, budget
        for link in self.drafters:
            link.send(target_pb2.VerifyMessage(sequence_id=seq_id, commit=message))


def check_resumed(resumed_ids: list[int], params, vocab_size: int) -> None:
    """Tokens of a generation resumed from a failed target: inside the vocabulary, and fewer than
    max_new_tokens (they count against it; a finished generation is never resumed)."""
    if len(resumed_ids) >= params.max_new_tokens:
        raise InvalidArgument(f"resumed_ids: {len(resumed_ids)} tokens already generated leave nothing of "
                              f"max_new_tokens ({params.max_new_tokens}) to generate")
    bad = next((t for t in resumed_ids if not 0 <= t < vocab_size), None)
    if bad is not None:
        raise InvalidArgument(f"resumed_ids: token id {bad} is outside the vocabulary [0, {vocab_size})")


def judge_draft(msg: target_pb2.DraftMessage, version: int, context_len: int, vocab_size: int,
                max_tree_nodes: int, max_len: int) -> tuple[int, str, DraftTree | None]:
    """(refusal kind, reason, None) for a draft that must not be verified, else (_, "", its tree)."""
    if msg.version > version:
        return Refusal.MALFORMED, (f"draft built on version {msg.version}, which is from the future: the sequence "
                                   f"is at {version}"), None
    if msg.version < version:
        return Refusal.STALE, f"draft built on version {msg.version}; the sequence is at {version}", None
    try:
        tree = tree_from_pb(msg.tree, vocab_size, max_tree_nodes)
        depth = max(tree_layout(tree.parent_ids).depths)
        room = max_len - context_len - 1
        if depth > room:
            raise InvalidArgument(f"draft depth {depth} runs past the context limit ({room} positions left)")
    except InvalidArgument as exc:
        return Refusal.MALFORMED, str(exc), None
    return Refusal.MALFORMED, "", tree


def refusal(seq_id: str, kind: int, reason: str, version: int = 0, context: list[int] = ()
            ) -> target_pb2.VerifyMessage:
    return target_pb2.VerifyMessage(sequence_id=seq_id, refusal=Refusal(
        kind=kind, reason=reason, current_version=version, context_ids=list(context)))
