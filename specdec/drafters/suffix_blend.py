"""One candidate tree from every match of the context's end, in both suffix tries, each weighted by
how often a match like it turns out right.

The longest earlier occurrence of the context's end is not always the best guide: a one- or
two-token match is a coincidence more often than not (its continuation is right about a third of the
time on the project's workloads), while a shorter match that occurred many times often knows better
(after `"` in a JSON answer, the keys that followed it so far). And an earlier generation in the
global store is a weaker witness than the current request's own text. So every distinct match
(each length at which the set of earlier occurrences grows, in the session's trie and in the
store's) is a source with a confidence, and the sources are blended as a back-off chain, as
prediction by partial matching does: the most confident source gets its confidence, the next one
its confidence of what is left, and so on. A candidate's probability is the weighted sum, over the
sources that continue it, of its frequency there; the tree takes the most probable candidates, so
it is wide where the sources disagree (short matches) and deep where one long match dominates.

A source's confidence grows with its match length and is lower in the global store (TRUST_OFFSET).
Learning it online (counting, per trie and match length, how often a source's top continuation was
the committed token) was tried and changed the workloads' tau by at most 0.03: the prior carries it.
Blending afresh at every node of the tree (prediction by partial matching proper) was tried too: it
lowered tau (a trust below 1 at every level makes a long copy look shallow) and cost 3-5x more.
"""
from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from specdec.drafters.suffix_tree import SuffixTrie

OWN, GLOBAL = 0, 1  # which trie a source lives in
# A match of m tokens is trusted m / (m + offset): the share of such matches whose most frequent
# continuation was the token the target committed, measured with benchmarks/suffix_trace.py on the
# greedy workloads (the session's own trie: 0.2-0.45 at m = 1, 0.5 at 2, 0.64 at 3, 0.7 at 4-5,
# 0.84 at 6-8, 0.97 beyond 12; the global store of other requests' answers about half that at m <= 3).
# Measured again at every position of the answers (each distinct match, not only the steps' longest):
# own 0.40 at m = 1, 0.54 at 2, 0.76 at 3, 0.65-0.78 at 4-5, 0.81 at 6-8, 0.85 at 9-12, 0.97 beyond, which
# m / (m + 1.5) fits better than m / (m + 2) below 6 (2 gave 0.33 at m = 1). Replayed with the policy and
# carry: suffix JSON tau 3.15 -> 3.17, code +0.025x, JSON +0.023x, summarization -0.016x, RAG and agent
# within 0.006x; at depth 8 code and JSON +0.02x, the rest within 0.003x or faster.
TRUST_OFFSET = (1.5, 4.0)
# How fast a continuation's doubt fades as the match it extends grows: see carry().
CARRY_SCALE = 6.0


def trust(kind: int, match_len: int) -> float:
    return match_len / (match_len + TRUST_OFFSET[kind])


def carry(match_len: int, miss: float) -> float:
    """The share of a source's weight that its continuation keeps for one more token, once the
    tokens before it matched: the match it extends is then match_len long, and the longer it is,
    the surer its next token. Without it, an earlier occurrence seen once is as sure at its 16th
    token as at its first (one path, count 1 of 1): a one-token coincidence's copy filled the tree
    as one chain, shutting out shallow alternatives, and its deep nodes promised what they never
    gave. Measured on the greedy workloads (benchmarks/suffix_trace.py, every position of the
    answers), a source in the session's own trie whose path so far was right missed the next token
    55-60% of the time at a 1-token match, 40-45% at 2, 20-30% at 3-4, 13-24% at 5-8, 6-15% at 9-16
    and 1-2% beyond: about 0.6 * exp(-(match_len - 1) / CARRY_SCALE). The drafter uses a gentler
    miss (SuffixConfig.carry_miss, 0.2): the policy's calibration corrects the scale per depth, so
    what carry has to get right is the ranking, and replayed with the policy 0.2-0.4 sped every
    workload up while 0.5-0.6 cost agent answers their long copies. 0 = no decay."""
    return 1.0 - miss * math.exp(-(match_len - 1) / CARRY_SCALE)


@dataclass(frozen=True)
class Source:
    kind: int  # OWN or GLOBAL
    match_len: int
    trie: SuffixTrie
    state: object  # the trie state after the matched tokens: a _Node or a leaf position


def sources(trie: SuffixTrie, kind: int, context_ids: list[int], reserve: int) -> list[Source]:
    """The distinct matches of the context's end in one trie, longest first: every match length at
    which the earlier occurrences (and so the continuation counts) differ from the longer match's.
    A match walks at most max_depth - reserve tokens, leaving the trie room for `reserve` more (a
    longer one continues from its end that short, and keeps its own length for its trust)."""
    tail = context_ids[-(trie.max_depth - 1):]
    room = max(1, trie.max_depth - reserve)
    found: list[Source] = []
    last_total = 0
    for m in range(trie.longest_match(tail), 0, -1):
        state = trie.find(tail[len(tail) - min(m, room):])
        total = sum(count for _, _, count in trie.continuations(state))
        if total not in (0, last_total):  # nested occurrence sets: the same total is the same set
            found.append(Source(kind, m, trie, state))
            last_total = total
    return found


def weights(all_sources: list[Source]) -> list[tuple[float, Source]]:
    """The back-off chain: sources by confidence, each weighted by its confidence times what the
    more confident ones left over."""
    rated = sorted(((trust(s.kind, s.match_len), s) for s in all_sources),
                   key=lambda cs: (-cs[0], cs[1].kind, -cs[1].match_len))
    left, out = 1.0, []
    for confidence, source in rated:
        out.append((left * confidence, source))
        left *= 1.0 - confidence
    return out


def blended_tree(weighted: list[tuple[float, Source]], max_tokens: int, max_nodes: int,
                 min_prob: float, carry_miss: float = 0.0) -> tuple[list[int], list[int], list[float]]:
    """(token ids, parent ids, probabilities): the max_nodes most probable candidates of at most
    max_tokens tokens, each of probability >= min_prob (that of its whole path under the blend, so
    never above its parent's), most probable first, every node after its parent. carry_miss: how
    much less sure a source is of each token after its first (carry); 0 = as sure."""
    token_ids: list[int] = []
    parent_ids: list[int] = []
    probs: list[float] = []
    heap: list[tuple] = []
    order = 0

    def push(alive: list[tuple[float, SuffixTrie, object, int]], index: int, depth: int) -> None:
        """Queue the children of node `index` (at `depth`); alive: (probability, trie, state, match
        length at the root) of each source that continues it."""
        nonlocal order
        if depth >= max_tokens:
            return
        merged: dict[int, list] = {}
        for prob, trie, state, match_len in alive:
            children = trie.continuations(state)
            if depth and carry_miss:
                prob *= carry(match_len + depth, carry_miss)
            total = sum(count for _, _, count in children)
            for token, child, count in children:
                entry = merged.setdefault(token, [0.0, []])
                p = prob * count / total
                entry[0] += p
                entry[1].append((p, trie, child, match_len))
        for token, (p, below) in merged.items():
            if p >= min_prob:
                heapq.heappush(heap, (-p, order, token, index, depth + 1, below))
                order += 1

    push([(w, s.trie, s.state, s.match_len) for w, s in weighted], -1, 0)
    while heap and len(token_ids) < max_nodes:
        neg_p, _, token, parent, depth, below = heapq.heappop(heap)
        token_ids.append(token)
        parent_ids.append(parent)
        probs.append(min(1.0, -neg_p))  # a sum of shares of 1, up to float rounding
        push(below, len(token_ids) - 1, depth)
    return token_ids, parent_ids, probs
