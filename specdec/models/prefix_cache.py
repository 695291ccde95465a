"""Keys and values of prompt openings, kept across requests (automatic prefix caching).

Chat requests share their openings: the chat template's system turn (~25 tokens of SmolLM2's), an
agent's instructions, the earlier turns a client resends. A sequence whose prompt starts with whole
blocks of `block_tokens` (8) that an earlier prompt prefilled copies those blocks' keys and values into its
own cache and prefills only the rest: less time to first token, and fewer prefill forwards taking the
decode loop's turn from the sequences already decoding.

Exact. The key and value at position i are a function of tokens 0..i alone: every kernel is row-
invariant (a row's result does not depend on the rows beside it; the runner prefills a prompt longer
than the attention kernel takes in calls it does take, since sdpa's rows are not) and a prefill row sees
exactly the cached keys before it, so entries copied from another prompt with the same opening are
bitwise the ones this sequence would have computed (tests/test_prefix_cache.py checks the stores and the
outputs). Where torch's kernels run (GPUs), sdpa's rows depend on the call's shape, so a restored opening
can move a later token's logits in the last bits there, as any other prefill split would.
At least one prompt token is always prefilled: its hidden state is what a self-drafting head (Medusa)
reads first. Heads that read every prompt position's features (EAGLE) and tensor-parallel ranks (whose
caches would have to agree rank by rank) prefill everything as before.

Bounded: blocks are evicted least recently used first once their bytes pass `max_bytes`, a run's
opening counted as used after its tail (so shared openings outlive the tails they lead to); a block is
kept only while the block before it is (a lookup walks from the first block, so an orphan is dead weight).
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass

import torch

BLOCK_TOKENS = 8  # SmolLM2's chat template opens with ~30 shared tokens: 16-token blocks restored 16 of them


@dataclass
class _Block:
    id: int  # the key of the blocks that follow it: (this id, their tokens)
    entries: torch.Tensor  # [layers, 2, kv_heads, block_tokens, head_dim]


class PrefixCache:
    """Blocks keyed by (the id of the block before, this block's tokens) with id 0 before the first: a
    block stands for the whole prefix it ends, and finding a prompt's run of blocks costs one short
    tuple a block, not the prefix up to it. Used by the one thread that runs the model's forwards."""

    def __init__(self, max_bytes: int, block_tokens: int = BLOCK_TOKENS):
        self.max_bytes, self.block_tokens = max_bytes, block_tokens
        self.blocks: OrderedDict[tuple[int, tuple[int, ...]], _Block] = OrderedDict()  # least recently used first
        self.children: dict[int, set[tuple[int, tuple[int, ...]]]] = {}  # block id -> keys of the blocks after it
        self.num_bytes = 0
        self.next_id = 1
        self.num_hit_tokens = self.num_looked_up_tokens = 0  # counters for the worker's figures

    def held(self, ids: list[int], most: int) -> list[tuple[tuple[int, ...], _Block]]:
        """(key, block) of the longest run of cached blocks that opens `ids`, at most `most` tokens."""
        run, parent = [], 0
        for end in range(self.block_tokens, most + 1, self.block_tokens):
            key = (parent, tuple(ids[end - self.block_tokens:end]))
            block = self.blocks.get(key)
            if block is None:
                break
            run.append((key, block))
            parent = block.id
        return run

    def restore(self, ids: list[int], cache, most: int) -> int:
        """Copy the longest run of cached blocks that opens `ids` (at most `most` tokens) into the empty
        static `cache`; returns how many tokens it now holds (0: nothing cached)."""
        self.num_looked_up_tokens += most
        run = self.held(ids, most)
        if not run:
            return 0
        self._touch([key for key, _ in run])
        first = run[0][1].entries
        if cache.store is None:  # like: [batch 1, kv_heads, 0, head_dim] in the blocks' dtype and device
            cache.allocate(first.new_empty(1, first.shape[2], 0, first.shape[4]))
        num_tokens = len(run) * self.block_tokens
        cache.reserve(num_tokens)
        cache.store[:, :, 0, :, :num_tokens] = torch.cat([block.entries for _, block in run], dim=3)
        cache.length = num_tokens
        self.num_hit_tokens += num_tokens
        return num_tokens

    def insert(self, ids: list[int], cache) -> None:
        """Keep the whole blocks of `ids`, whose entries `cache` (batch 1) holds from position 0."""
        keys, parent = [], 0
        for end in range(self.block_tokens, min(len(ids), cache.length) + 1, self.block_tokens):
            key = (parent, tuple(ids[end - self.block_tokens:end]))
            block = self.blocks.get(key)
            if block is None:
                block = _Block(self.next_id, cache.store[:, :, 0, :, end - self.block_tokens:end].clone())
                self.next_id += 1
                self.blocks[key] = block
                self.children.setdefault(parent, set()).add(key)
                self.num_bytes += block.entries.nbytes
            keys.append(key)
            parent = block.id
        self._touch(keys)
        self._evict()

    def _touch(self, keys: list[tuple[int, tuple[int, ...]]]) -> None:
        """Mark a run of blocks (first block first) used now, the first most recently: an opening many
        prompts share outlives the tails it leads to, which go first."""
        for key in reversed(keys):
            self.blocks.move_to_end(key)

    def _evict(self) -> None:
        while self.num_bytes > self.max_bytes and self.blocks:
            self._drop(next(iter(self.blocks)))

    def _drop(self, key: tuple[int, tuple[int, ...]]) -> None:
        """A block and, since nothing can reach them any more, every block after it."""
        self.children.get(key[0], set()).discard(key)
        doomed = [key]
        while doomed:  # a loop, not recursion: a long prompt's run is hundreds of blocks deep
            block = self.blocks.pop(doomed.pop())
            self.num_bytes -= block.entries.nbytes
            doomed.extend(self.children.pop(block.id, ()))
