"""bench-quick: plain decoding vs each drafter on SmolLM2, greedy, code/JSON/copy-heavy prompts.

    make bench-quick            # or: .venv/bin/python benchmarks/quick.py --max-new-tokens 128

Ratios measured in one run are the figures that count (docs/architecture.md); every method's token
ids must equal plain decoding's, and the script exits 1 if any differ.
"""
from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from specdec.bench.machine import machine_info
from specdec.core.types import SamplingParams
from specdec.drafters import build_drafter
from specdec.engine import Engine, EngineConfig
from specdec.models.loader import load_model, pick_dtype, random_draft_path

PROMPTS = [
    'Repeat the following JSON exactly: {"name": "Ada", "age": 36, "city": "London", "skills": ["math", "poetry"]}',
    'Fix the typo and return the whole JSON: {"id": 17, "titel": "Report", "pages": 12, "tags": ["q3", "draft"]}',
    "Rewrite this function exactly, but rename it to total:\n```python\ndef add(a, b):\n    result = a + b\n"
    "    return result\n```",
    "Add type hints to this code and return all of it:\n```python\ndef greet(name):\n    message = 'Hello, ' + name\n"
    "    print(message)\n    return message\n```",
    "Convert this CSV to a JSON list of objects:\nname,age\nalice,30\nbob,25\ncarol,41",
    "Copy this sentence three times: The quick brown fox jumps over the lazy dog.",
    "Repeat the text exactly: To be, or not to be, that is the question: Whether 'tis nobler in the mind to suffer "
    "the slings and arrows of outrageous fortune.",
    "Format this as a Markdown table with columns Name and Score: Ann 90, Ben 85, Cid 77, Dee 92.",
    'Return this YAML as JSON:\nserver:\n  host: 127.0.0.1\n  port: 8080\n  workers: 4',
    "Write the SQL query again with the table renamed from users to customers: "
    "SELECT id, name, email FROM users WHERE age > 30 ORDER BY name;",
    "List the numbers from 1 to 20 separated by commas.",
    "Here is a list: red, green, blue, yellow, purple. Write it again in reverse order, then in the original order.",
]

METHODS = {  # name -> (drafter, drafter options)
    "plain": ("none", {}),
    "ngram": ("ngram", {}),
    "ngram-tree": ("ngram", {"num_branches": 4}),  # as Spec-Bench's (the default ngram is a trie of 3 now)
    "draft": ("draft", {}),
    "draft-tree": ("draft", {"tree_width": 2}),
    "random-draft": ("random", {}),  # an untrained draft: always wrong, so this row shows what adaptivity costs
}


@dataclass
class Totals:
    tokens: int = 0
    seconds: float = 0.0
    forwards: int = 0
    drafted: int = 0
    accepted: int = 0
    mismatches: int = 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--methods", nargs="+", default=list(METHODS), choices=list(METHODS))
    parser.add_argument("--out", default="benchmarks/results")
    parser.add_argument("--num-prompts", type=int, default=len(PROMPTS))
    args = parser.parse_args()
    dtype = pick_dtype("auto")
    target = load_model(None, dtype)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    def drafter(name: str, opts: dict):
        if name == "random":
            return build_drafter("draft", target, random_draft_path(target), opts, dtype)
        return build_drafter(name, target, None, opts, dtype)

    engines = {name: Engine(target, drafter(d, dict(opts)), EngineConfig())
               for name, (d, opts) in METHODS.items() if name in args.methods or name == "plain"}
    for engine in engines.values():  # warm-up: first-call allocations and lazy inits
        engine.generate(PROMPTS[0], SamplingParams(max_new_tokens=8), chat=True)
    totals = {name: Totals() for name in engines}
    reference: dict[int, list[int]] = {}
    # Interleave methods per prompt so drift in machine load hits every method alike.
    for i, prompt in enumerate(tqdm(PROMPTS[:args.num_prompts], desc="prompts")):
        for name, engine in engines.items():
            out = engine.generate(prompt, params, chat=True)
            t = totals[name]
            t.tokens += out.stats.num_new_tokens
            t.seconds += out.stats.elapsed_s - out.stats.prefill_s
            t.forwards += out.stats.num_target_forwards
            t.drafted += out.stats.num_draft_tokens
            t.accepted += out.stats.num_accepted_tokens
            reference.setdefault(i, out.token_ids)
            t.mismatches += out.token_ids != reference[i]
    base = totals["plain"].tokens / totals["plain"].seconds
    rows = []
    for name, t in totals.items():
        tps = t.tokens / t.seconds
        rows.append({"method": name, "tokens_per_s": tps, "speedup": tps / base, "tau": t.tokens / t.forwards,
                     "acceptance_rate": t.accepted / t.drafted if t.drafted else 0.0, "mismatches": t.mismatches})
    table = ["| method | tokens/s | speedup | tau | acceptance | greedy mismatches |", "|---|---|---|---|---|---|"]
    table += [f"| {r['method']} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {r['tau']:.2f} | "
              f"{r['acceptance_rate']:.2f} | {r['mismatches']} |" for r in rows]
    machine = machine_info()
    print(f"{machine['cpu']} (flags: {' '.join(machine['cpu_flags']) or 'none'}), {machine['torch_num_threads']} "
          f"threads, load {machine.get('load_average_1m')}, {dtype}")
    print("\n".join(table))
    out_dir = Path(args.out)
    out_dir.mkdir(parents=True, exist_ok=True)
    meta = {"machine": machine,
            "dtype": str(dtype), "max_new_tokens": args.max_new_tokens, "num_prompts": args.num_prompts,
            "torch": torch.__version__}
    (out_dir / "quick.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=2))
    (out_dir / "quick.md").write_text("\n".join(table) + "\n")
    return 1 if any(r["mismatches"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
