"""The target's KV cache budget (the rules are specdec.kv_ledger's): an admission that does not fit
now is refused with RESOURCE_EXHAUSTED (the router queues it and tries again when room frees), one
that could not fit even in an empty cache with INVALID_ARGUMENT (retrying cannot help).

The reservations live on the held sequences themselves (`SeqState.kv_tokens`), so whatever path
drops a sequence (finish, release, cancellation, a failed step) gives its tokens back with it.
The worker calls these under its own lock.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from specdec.errors import ResourceExhausted
from specdec.kv_ledger import KvLedger, tokens_needed


@dataclass(frozen=True)
class KvFigures:
    capacity_tokens: int
    reserved_tokens: int
    used_tokens: int  # tokens in the held sequences' contexts now
    num_sequences: int
    max_sequences: int
    num_refused: int


class KvRoom:
    def __init__(self, capacity_tokens: int, max_sequences: int):
        self.capacity_tokens, self.max_sequences = capacity_tokens, max_sequences
        self.num_refused = 0

    def check_possible(self, prompt_len: int, max_new_tokens: int) -> int:
        """The tokens to reserve; INVALID_ARGUMENT if even an empty cache could not hold them."""
        return tokens_needed(prompt_len, max_new_tokens, self.capacity_tokens,
                             "this target's whole cache", " (--max-kv-tokens, or on a GPU --gpu-memory-fraction)")

    def check_room(self, seqs: Mapping[str, object], need: int) -> None:
        """RESOURCE_EXHAUSTED unless one more sequence of `need` tokens fits beside `seqs` now."""
        reason = KvLedger(self.capacity_tokens, self.max_sequences, self.reserved(seqs), len(seqs)).refusal(need)
        if reason is not None:
            self.num_refused += 1
            raise ResourceExhausted(reason)

    @staticmethod
    def reserved(seqs: Mapping[str, object]) -> int:
        return sum(state.kv_tokens for state in seqs.values())

    def figures(self, seqs: Mapping[str, object]) -> KvFigures:
        return KvFigures(self.capacity_tokens, self.reserved(seqs), sum(state.context_len for state in seqs.values()),
                         len(seqs), self.max_sequences, self.num_refused)
