"""The suffix trie against brute force: counts of every substring after appends, pops and evictions,
the global store's bound, the longest match and the candidate tree's shape and order."""
from __future__ import annotations

import random

import pytest

from specdec.drafters.suffix import SuffixStore
from specdec.drafters.suffix_blend import OWN, Source, blended_tree
from specdec.drafters.suffix_tree import SENTINEL, SuffixTrie, _Node


def trie_count(trie: SuffixTrie, pattern: list[int]) -> int:
    state = trie.find(pattern)
    return 0 if state is None else (state.count if isinstance(state, _Node) else 1)


def brute_counts(sequences: list[list[int]], max_depth: int) -> dict[tuple[int, ...], int]:
    counts: dict[tuple[int, ...], int] = {}
    for seq in sequences:
        for i in range(len(seq)):
            for j in range(i + 1, min(len(seq), i + max_depth) + 1):
                key = tuple(seq[i:j])
                counts[key] = counts.get(key, 0) + 1
    return counts


def assert_counts(trie: SuffixTrie, sequences: list[list[int]], alphabet: int) -> None:
    expected = brute_counts(sequences, trie.max_depth)
    for key, count in expected.items():
        assert trie_count(trie, list(key)) == count, key
    # substrings absent from the text are absent from the trie (a few random probes per length)
    rng = random.Random(len(expected))
    for length in range(1, trie.max_depth + 1):
        for _ in range(5):
            probe = tuple(rng.randrange(alphabet) for _ in range(length))
            assert trie_count(trie, list(probe)) == expected.get(probe, 0)


@pytest.mark.parametrize("seed", range(6))
def test_counts_follow_appends_and_pops(seed):
    rng = random.Random(seed)
    alphabet = 2 + seed % 3  # small alphabets repeat a lot: splits, deep nodes, periodic runs
    trie = SuffixTrie(max_depth=5)
    text: list[int] = []
    for _ in range(300):
        if text and rng.random() < 0.3:
            for _ in range(rng.randint(1, 4)):
                if text:
                    trie.pop()
                    text.pop()
        else:
            token = rng.randrange(alphabet)
            trie.append(token)
            text.append(token)
        assert trie.tokens == text
    assert_counts(trie, [text], alphabet)
    while text:  # popping everything leaves an empty trie
        trie.pop()
        text.pop()
    assert trie.num_nodes == 0 and trie.root.child is None and trie.root.more is None


@pytest.mark.parametrize("seed", range(4))
def test_store_evicts_oldest_sequences_and_keeps_exact_counts(seed):
    rng = random.Random(100 + seed)
    store = SuffixStore(max_depth=4, max_tokens=60)
    kept: list[list[int]] = []
    for _ in range(40):
        seq = [rng.randrange(3) for _ in range(rng.randint(1, 25))]
        store.add(seq)
        kept.append(seq)
        while sum(map(len, kept)) > 60:
            kept.pop(0)
        assert store.num_tokens == sum(map(len, kept)) <= store.max_tokens
        assert store.num_sequences == len(kept)
    assert_counts(store.trie, kept, 3)
    assert len(store.trie.tokens) == sum(len(s) + 1 for s in kept)  # evicted text is dropped too
    assert store.trie.tokens.count(SENTINEL) == len(kept)


def test_node_count_stays_bounded_under_a_long_stream():
    rng = random.Random(7)
    phrases = [[rng.randrange(1000) for _ in range(rng.randint(3, 10))] for _ in range(50)]
    store = SuffixStore(max_depth=8, max_tokens=500)
    sizes = []
    for _ in range(400):
        store.add([t for _ in range(5) for t in rng.choice(phrases)])
        sizes.append(store.trie.num_nodes)
    assert store.num_tokens <= 500
    assert max(sizes[200:]) <= 8 * 500  # never more than one node per substring of the kept text
    assert max(sizes[200:]) < 1.5 * max(sizes[100:200]) + 50  # flat once full: eviction frees what it uncounts


def test_a_sequence_longer_than_the_budget_keeps_its_end():
    store = SuffixStore(max_depth=3, max_tokens=4)
    store.add([1, 2, 3, 4, 5, 6])
    assert store.num_tokens == 4 and trie_count(store.trie, [3, 4, 5]) == 1 and trie_count(store.trie, [1]) == 0


def test_longest_match_needs_a_continuation():
    trie = SuffixTrie(max_depth=8)
    for token in [5, 1, 2, 3, 9, 1, 2, 3]:
        trie.append(token)
    # [1, 2, 3] occurred before and went on (to 9); the whole tail [9, 1, 2, 3] only occurs at the end
    assert trie.longest_match([9, 1, 2, 3]) == 3
    assert trie.longest_match([7, 7]) == 0


def test_candidate_tree_follows_frequencies_most_likely_first():
    trie = SuffixTrie(max_depth=8)
    # after "1 2": 3 twice (then 4 once, 5 once) and 6 once
    for seq in ([1, 2, 3, 4], [1, 2, 3, 5], [1, 2, 6]):
        for token in seq:
            trie.append(token)
        trie.end_sequence()
    one = [(1.0, Source(OWN, 2, trie, trie.find([1, 2])))]  # one source, fully trusted
    tokens, parents, probs = blended_tree(one, max_tokens=4, max_nodes=10, min_prob=0.0)
    assert tokens == [3, 6, 4, 5] and parents == [-1, -1, 0, 0]  # 2/3, then 1/3 and 1/3, 1/3 in insertion order
    assert probs == pytest.approx([2 / 3, 1 / 3, 1 / 3, 1 / 3])  # each its whole path's probability
    assert all(p < i for i, p in enumerate(parents))
    # a probability floor drops the rare branches; a node budget and a depth bound are honoured
    assert blended_tree(one, 4, 10, min_prob=0.5)[0] == [3]
    assert blended_tree(one, 4, 2, 0.0)[0] == [3, 6]
    assert blended_tree(one, 1, 10, 0.0)[0] == [3, 6]
    # a source's weight scales every probability below it
    assert blended_tree([(0.5, one[0][1])], 4, 10, 0.0)[2] == pytest.approx([p / 2 for p in probs])
