"""Keys and values of prompt openings, kept across requests (automatic prefix caching).

Chat requests share their openings: the chat template's system turn (~25 tokens of SmolLM2's), an
agent's instructions, the earlier turns a client resends. A sequence whose prompt starts with whole
blocks of `block_tokens` (8) that an earlier prompt prefilled copies those blocks' keys and values into its
own cache and prefills only the rest: less time to first token, and fewer prefill forwards taking the
decode loop's turn from the sequences already decoding.

Exact. The key and value at position i are a function of tokens 0..i alone: every kernel is row-
invariant (a row's result does not depend on the rows beside it) and a prefill row sees exactly the
cached keys before it, so entries copied from another prompt with the same opening are bitwise the
ones this sequence would have computed (tests/test_prefix_cache.py checks the stores and the outputs).
At least one prompt token is always prefilled: its hidden state is what a self-drafting head (Medusa)
reads first. Heads that read every prompt position's features (EAGLE) and tensor-parallel ranks (whose
caches would have to agree rank by rank) prefill everything as before.

Bounded: blocks are evicted least recently used first once their bytes pass `max_bytes`, a run's
opening counted as used after its tail (so shared openings outlive the tails they lead to); a block is
kept only while the block before it is (a lookup walks from the first block, so an orphan is dead weight).
"""
from __future__ import annotations

from collections import OrderedDict

import torch

BLOCK_TOKENS = 8  # SmolLM2's chat template opens with ~30 shared tokens: 16-token blocks restored 16 of them


class PrefixCache:
    """Blocks keyed by the whole token prefix they end (tuple(ids[:end]), end a multiple of block_tokens),
    each holding that block's entries [layers, 2, kv_heads, block_tokens, head_dim]. Used by the one
    thread that runs the model's forwards."""

    def __init__(self, max_bytes: int, block_tokens: int = BLOCK_TOKENS):
        self.max_bytes, self.block_tokens = max_bytes, block_tokens
        self.blocks: OrderedDict[tuple[int, ...], torch.Tensor] = OrderedDict()
        self.num_bytes = 0
        self.num_hit_tokens = self.num_looked_up_tokens = 0  # counters for the worker's figures

    def restore(self, ids: list[int], cache, most: int) -> int:
        """Copy the longest run of cached blocks that opens `ids` (at most `most` tokens) into the empty
        static `cache`; returns how many tokens it now holds (0: nothing cached)."""
        self.num_looked_up_tokens += most
        found: list[torch.Tensor] = []
        keys: list[tuple[int, ...]] = []
        for end in range(self.block_tokens, most + 1, self.block_tokens):
            key = tuple(ids[:end])
            block = self.blocks.get(key)
            if block is None:
                break
            found.append(block)
            keys.append(key)
        if not found:
            return 0
        self._touch(keys)
        if cache.store is None:  # like: [batch 1, kv_heads, 0, head_dim] in the blocks' dtype and device
            cache.allocate(found[0].new_empty(1, found[0].shape[2], 0, found[0].shape[4]))
        num_tokens = len(found) * self.block_tokens
        cache.reserve(num_tokens)
        cache.store[:, :, 0, :, :num_tokens] = torch.cat(found, dim=3)
        cache.length = num_tokens
        self.num_hit_tokens += num_tokens
        return num_tokens

    def insert(self, ids: list[int], cache) -> None:
        """Keep the whole blocks of `ids`, whose entries `cache` (batch 1) holds from position 0."""
        keys = []
        for end in range(self.block_tokens, min(len(ids), cache.length) + 1, self.block_tokens):
            key = tuple(ids[:end])
            keys.append(key)
            if key not in self.blocks:
                block = cache.store[:, :, 0, :, end - self.block_tokens:end].clone()
                self.blocks[key] = block
                self.num_bytes += block.nbytes
        self._touch(keys)
        self._evict()

    def _touch(self, keys: list[tuple[int, ...]]) -> None:
        """Mark a run of blocks (shortest first) used now, the shortest most recently: an opening many
        prompts share outlives the tails it leads to, which go first."""
        for key in reversed(keys):
            self.blocks.move_to_end(key)

    def _evict(self) -> None:
        while self.num_bytes > self.max_bytes and self.blocks:
            key, block = self.blocks.popitem(last=False)
            self.num_bytes -= block.nbytes
            # the blocks after it can no longer be reached from the first block: drop them too
            for longer in [k for k in self.blocks if len(k) > len(key) and k[:len(key)] == key]:
                self.num_bytes -= self.blocks.pop(longer).nbytes
