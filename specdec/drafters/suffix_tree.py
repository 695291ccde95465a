"""Suffix tries with occurrence counts: the data structure behind the suffix drafter.

A `SuffixTrie` owns a token text (one context, or many sequences separated by SENTINEL) and holds
every substring of at most `max_depth` tokens of it, each with the number of times it occurs. It is
SuffixDecoding's suffix tree cut at a fixed depth, with the one compression that matters for text
that is mostly new: a substring seen only once is not spelled out node by node but kept as a leaf,
the int position in the text where its continuation starts. Only repeated substrings get nodes.

- `append` adds one token: it extends the repeated suffixes that end at the previous token (the
  trie keeps them, `ends`): a new continuation becomes a leaf, a leaf met a second time is split
  into a node. O(number of repeated suffixes) <= max_depth per token.
- `pop` takes the last token back (a session's rollback after a rejected pipelined guess);
  `remove_first` uncounts the oldest sequence (the global store's eviction) by replaying it.
- `longest_match` finds the longest suffix of a context that occurred before *with a continuation*;
  `find` walks to the state of a pattern, and `continuations` lists what followed it and how often
  (what the candidate tree reads, specdec.drafters.suffix_blend).

Pure Python on purpose: a token costs microseconds (benchmarks/suffix_update.py), far below a
target forward.
"""
from __future__ import annotations

SENTINEL = -1  # ends a sequence in the text; never a token, so nothing matches or continues across it


class _Node:
    """A repeated substring. One child lives in (token, child); more move into the dict `more`.
    A child is a _Node, or an int: a leaf, the text position where its single occurrence continues."""

    __slots__ = ("count", "token", "child", "more")

    def __init__(self, count: int) -> None:
        self.count = count
        self.token = SENTINEL
        self.child: _Node | int | None = None
        self.more: dict[int, _Node | int] | None = None


def _get(node: _Node, token: int):
    if node.more is not None:
        return node.more.get(token)
    return node.child if node.token == token else None


def _set(node: _Node, token: int, child) -> None:
    if node.more is not None:
        node.more[token] = child
    elif node.child is None or node.token == token:
        node.token, node.child = token, child
    else:
        node.more = {node.token: node.child, token: child}
        node.token, node.child = SENTINEL, None


def _delete(node: _Node, token: int) -> None:
    if node.more is None:
        node.token, node.child = SENTINEL, None
        return
    del node.more[token]
    if len(node.more) == 1:
        ((node.token, node.child),) = node.more.items()
        node.more = None


def _items(node: _Node):
    if node.more is not None:
        return node.more.items()
    return ((node.token, node.child),) if node.child is not None else ()


class SuffixTrie:
    def __init__(self, max_depth: int):
        self.max_depth = max_depth
        self.root = _Node(0)
        self.tokens: list[int] = []  # the text; absolute position a is tokens[a - offset]
        self.offset = 0  # positions removed from the front (remove_first)
        self.ends: list[_Node] = []  # nodes of the repeated suffixes ending at the last token, shortest first
        self.num_nodes = 0

    @property
    def end(self) -> int:
        return self.offset + len(self.tokens)

    def at(self, pos: int) -> int:
        """The token at absolute position pos; SENTINEL past the end."""
        i = pos - self.offset
        return self.tokens[i] if i < len(self.tokens) else SENTINEL

    def append(self, token: int) -> None:
        self.tokens.append(token)
        after = self.end  # where the new token's continuation will start
        new: list[_Node] = []
        for depth, node in enumerate((self.root, *self.ends[: self.max_depth - 1])):  # child: depth + 1
            child = _get(node, token)
            if child is None:  # first occurrence of this substring: a leaf (and longer ones are new too)
                _set(node, token, after)
                continue
            if type(child) is int:  # seen once before: now a node of count 2 that keeps the old continuation
                earlier = child
                child = _Node(2)
                self.num_nodes += 1
                _set(node, token, child)
                following = self.at(earlier)
                if depth + 1 < self.max_depth and following != SENTINEL:
                    _set(child, following, earlier + 1)
            else:
                child.count += 1
            new.append(child)
        self.ends = new

    def end_sequence(self) -> None:
        """Close the current sequence: the next token starts a new one."""
        self.tokens.append(SENTINEL)
        self.ends = []

    def _uncount(self, node: _Node, token: int) -> _Node | None:
        """Remove one occurrence of node's substring + token; returns the child node, None for a leaf."""
        child = _get(node, token)
        if type(child) is int:
            _delete(node, token)
            return None
        child.count -= 1
        if child.count == 0:  # detached; its own children are uncounted by the caller's next steps
            _delete(node, token)
            self.num_nodes -= 1
        return child

    def pop(self) -> None:
        """Take back the last token (it must not be a SENTINEL)."""
        previous = self._repeated_suffixes(self.end - 1)
        token = self.tokens[-1]
        for node in (self.root, *previous[: self.max_depth - 1]):
            self._uncount(node, token)
        self.tokens.pop()
        self.ends = previous

    def remove_first(self, length: int) -> None:
        """Uncount the first `length` tokens of the text and drop them with the SENTINEL after them."""
        ends: list[_Node] = []
        for token in self.tokens[:length]:
            new = []
            for node in (self.root, *ends[: self.max_depth - 1]):
                child = self._uncount(node, token)
                if child is not None:
                    new.append(child)
            ends = new
        del self.tokens[: length + 1]
        self.offset += length + 1

    def _repeated_suffixes(self, stop: int) -> list[_Node]:
        """The nodes of the repeated suffixes of the text before absolute position `stop` (O(depth^2))."""
        found: list[_Node] = []
        for length in range(1, self.max_depth + 1):
            state = self.find([self.at(p) for p in range(stop - length, stop)]) if stop - length >= self.offset else None
            if not isinstance(state, _Node):
                break
            found.append(state)
        return found

    def continuations(self, state) -> list[tuple[int, object, int]]:
        """(token, state after it, count) for every continuation of a state `find` returned."""
        if type(state) is int:  # inside a leaf: the one continuation the text has
            token = self.at(state)
            return [] if token == SENTINEL else [(token, state + 1, 1)]
        return [(t, c, 1 if type(c) is int else c.count) for t, c in _items(state)]

    def find(self, pattern):
        """The state after reading pattern from the root: a _Node, an int (inside a leaf), or None."""
        state = self.root
        for token in pattern:
            if token == SENTINEL:
                return None
            if type(state) is int:
                if self.at(state) != token:
                    return None
                state += 1
            else:
                state = _get(state, token)
                if state is None:
                    return None
        return state

    def continues(self, state) -> bool:
        if type(state) is int:
            return self.at(state) != SENTINEL
        return state is not None and (state.more is not None or state.child is not None)

    def longest_match(self, tail: list[int]) -> int:
        """Length of the longest suffix of `tail` that occurred followed by some token.

        Monotone in the length (a suffix of a continued match is a continued match), so a binary
        search needs O(log len(tail)) walks."""
        lo, hi = 0, len(tail)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.continues(self.find(tail[len(tail) - mid:])):
                lo = mid
            else:
                hi = mid - 1
        return lo
