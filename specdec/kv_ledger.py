"""KV cache reservations: the one ledger behind admission on the router and on the target.

A sequence admitted with room only for its prompt would fail halfway through its generation when the
cache fills, after the client has seen part of its answer. So each sequence reserves prompt +
max_new_tokens tokens of its target's cache at admission and keeps them until it ends. The target
keeps the authoritative ledger (refusing with RESOURCE_EXHAUSTED what does not fit now); each router
keeps its own copy per target, from the capacity the target reports, to place requests without a
round trip. Both ask the same questions of the same numbers, here.
"""
from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import InvalidArgument


@dataclass
class KvLedger:
    capacity_tokens: int = 0  # 0 = unknown (the target itself refuses what does not fit)
    max_sequences: int = 0  # 0 = unknown
    reserved_tokens: int = 0
    num_sequences: int = 0

    def free_tokens(self) -> float:
        return float("inf") if not self.capacity_tokens else self.capacity_tokens - self.reserved_tokens

    def refusal(self, tokens: int) -> str | None:
        """Why one more sequence reserving `tokens` does not fit now (None: it fits)."""
        if self.max_sequences and self.num_sequences >= self.max_sequences:
            return f"target holds {self.num_sequences} sequences, its limit"
        if self.free_tokens() < tokens:
            return (f"target KV cache full: the sequence needs {tokens} tokens (prompt plus max_new_tokens), "
                    f"{self.capacity_tokens - self.reserved_tokens} of {self.capacity_tokens} are free")
        return None

    def fits(self, tokens: int) -> bool:
        return self.refusal(tokens) is None

    def reserve(self, tokens: int) -> None:
        self.reserved_tokens += tokens
        self.num_sequences += 1

    def give_back(self, tokens: int) -> None:
        self.reserved_tokens -= tokens
        self.num_sequences -= 1


def tokens_needed(prompt_len: int, max_new_tokens: int, largest_capacity: int, where: str, hint: str = "") -> int:
    """The reservation of one sequence; INVALID_ARGUMENT if even the largest empty cache (0 = unknown)
    could not hold it: retrying cannot help."""
    need = prompt_len + max_new_tokens
    if largest_capacity and need > largest_capacity:
        raise InvalidArgument(f"prompt ({prompt_len} tokens) plus max_new_tokens ({max_new_tokens}) needs {need} "
                              f"tokens of KV cache, more than {where} of {largest_capacity} tokens{hint}")
    return need
