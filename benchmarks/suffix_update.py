"""What the suffix drafter costs per token, on the CPU: microseconds, not milliseconds.

    PYTHONPATH=. python benchmarks/suffix_update.py [--tokens 20000] [--depth 24]

Measures, over a token stream with the repetition of real text (token ids of the project's own
README through the embedded tokenizer when it is available, else a synthetic stream of repeated
phrases):
- per-request insert: one committed token appended to a session's trie (SuffixTrie.append),
- global insert: a finished generation added to the global store (SuffixStore.add), per token,
  including the eviction of older sequences once the store is full,
- a whole propose (sync one new token + match + candidate tree from both tries),
and the memory the tries take (nodes, and bytes per token from tracemalloc). Prints one JSON object.
"""
from __future__ import annotations

import argparse
import json
import random
import time
import tracemalloc
from pathlib import Path

from specdec.core.types import SamplingParams
from specdec.drafters.suffix import SuffixConfig, SuffixDrafter, SuffixStore
from specdec.drafters.suffix_tree import SuffixTrie

REPO = Path(__file__).resolve().parents[1]


def token_stream(num_tokens: int) -> tuple[list[int], str]:
    try:
        from specdec.models.loader import resolve_path
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(resolve_path(None), local_files_only=True)
        text = "\n".join(p.read_text() for p in sorted(REPO.glob("**/*.py")) if ".venv" not in p.parts)
        ids = tokenizer.encode(text)
        return (ids * (num_tokens // len(ids) + 1))[:num_tokens], "the repository's Python sources, tokenized"
    except Exception:  # noqa: BLE001 - no model here: synthetic text with repeats
        rng = random.Random(0)
        phrases = [[rng.randrange(49152) for _ in range(rng.randrange(3, 12))] for _ in range(400)]
        ids: list[int] = []
        while len(ids) < num_tokens:
            ids += rng.choice(phrases)
        return ids[:num_tokens], "synthetic: random picks from 400 random phrases"


def per_token_us(fn, num_tokens: int) -> float:
    start = time.perf_counter()
    fn()
    return (time.perf_counter() - start) / num_tokens * 1e6


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tokens", type=int, default=20000)
    p.add_argument("--depth", type=int, default=SuffixConfig.max_depth)
    p.add_argument("--sequence-len", type=int, default=500, help="tokens per generation fed to the global store")
    args = p.parse_args()
    ids, source = token_stream(args.tokens)

    trie = SuffixTrie(args.depth)

    def per_request():
        for token in ids:
            trie.append(token)

    request_us = per_token_us(per_request, len(ids))
    tracemalloc.start()  # memory in a second pass: tracing slows the timed one down
    trie = SuffixTrie(args.depth)
    per_request()
    request_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()

    store = SuffixStore(args.depth, max_tokens=args.tokens // 4)  # fills, then evicts for 3/4 of the stream
    chunks = [ids[i:i + args.sequence_len] for i in range(0, len(ids), args.sequence_len)]
    global_us = per_token_us(lambda: [store.add(chunk) for chunk in chunks], len(ids))

    drafter = SuffixDrafter(SuffixConfig(max_depth=args.depth))
    for chunk in chunks[:20]:
        drafter.store.add(chunk)
    session = drafter.new_session()
    params = SamplingParams()
    context = ids[: len(ids) // 2]
    session.propose(context, 8, params, None)
    steps = ids[len(ids) // 2: len(ids) // 2 + 2000]
    start = time.perf_counter()
    num_nodes = 0
    for token in steps:
        context.append(token)
        num_nodes += session.propose(context, 8, params, None).num_nodes
    propose_us = (time.perf_counter() - start) / len(steps) * 1e6

    pop_us = per_token_us(lambda: [trie.pop() for _ in range(200)], 200)  # a rollback, token by token
    print(json.dumps({
        "source": source, "num_tokens": len(ids), "max_depth": args.depth,
        "per_request_insert_us_per_token": round(request_us, 2),
        "global_insert_us_per_token": round(global_us, 2),
        "global_store_tokens": store.num_tokens, "global_store_nodes": store.trie.num_nodes,
        "propose_us_per_step": round(propose_us, 1), "mean_draft_nodes": round(num_nodes / len(steps), 2),
        "per_request_nodes": trie.num_nodes, "per_request_nodes_per_token": round(trie.num_nodes / len(ids), 2),
        "pop_us_per_token": round(pop_us, 1),
        "per_request_bytes_per_token": round(request_bytes / len(ids)),
    }, indent=1))


if __name__ == "__main__":
    main()
