"""The draft workers' side of the target worker: their Verify streams (bounded in number) and the
drafts they offer, judged before anything is queued for verification.

A mixin of TargetWorker, kept apart because it is the part that talks to other processes' drafts:
it uses the worker's `cond`, `seqs`, `links`, `config` and `engine`.
"""
from __future__ import annotations

import time

from specdec.errors import ResourceExhausted
from specdec.keys import key_matches
from specdec.rpc.v1 import target_pb2
from target_service.seq_state import DrafterLink, judge_draft, refusal

Refusal = target_pb2.Refusal


class DraftIntake:
    def open_link(self) -> DrafterLink:
        """A draft worker's Verify stream; RESOURCE_EXHAUSTED beyond max_draft_links of them."""
        with self.cond:
            if len(self.links) >= self.config.max_draft_links:
                raise ResourceExhausted(f"{len(self.links)} draft workers are connected, the limit "
                                        f"(--max-draft-links)")
            link = DrafterLink()
            self.links.add(link)
            return link

    def drop_link(self, link: DrafterLink) -> None:
        """A draft worker's stream ended: its sequences decode on without it."""
        with self.cond:
            link.alive = False
            self.links.discard(link)
            for state in self.seqs.values():
                if link in state.drafters:
                    state.drafters.discard(link)
                    state.expect_drafts = False  # that worker is gone: no wait for it (a live one still counts)
            self.cond.notify_all()
        link.outbox.put(None)

    def offer_draft(self, link: DrafterLink, msg: target_pb2.DraftMessage) -> None:
        """Queue a draft for verification, or answer the link with a Refusal. Only a draft with the
        sequence's draft key makes this link one of its drafters (which receive its commits); any other
        is refused without a word about the sequence's state."""
        with self.cond:
            state = self.seqs.get(msg.sequence_id)
            if state is None:
                return link.send(refusal(msg.sequence_id, Refusal.UNKNOWN_SEQUENCE,
                                         f"no sequence {msg.sequence_id!r} here (finished or released)"))
            if not key_matches(state.draft_key, msg.draft_key):  # before anything is disclosed or changed
                return link.send(refusal(msg.sequence_id, Refusal.NOT_ATTACHED,
                                         f"sequence {msg.sequence_id!r} takes drafts only from the draft worker "
                                         f"attached to it (this draft lacks its draft_key)"))
            state.drafters.add(link)
            state.missed = 0  # even a stale draft shows a live drafter: give it the next wait again
            version, context = state.version, state.seq.context[:state.context_len]
        kind, reason, tree = judge_draft(msg, version, len(context), self.engine.runner.vocab_size,
                                         self.config.max_tree_nodes, self.engine.max_len)
        if tree is None:
            return link.send(refusal(msg.sequence_id, kind, reason, version, context))
        with self.cond:
            if self.seqs.get(msg.sequence_id) is state and state.version == version and state.pending is None:
                state.pending, state.draft_at = tree, time.monotonic()
                state.draft_trace = dict(msg.trace_context) if msg.trace_context else None
                self.cond.notify_all()
        return None
