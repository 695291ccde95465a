"""How far bfloat16 and float32 greedy decoding of the same checkpoint stay together, on Spec-Bench questions.

Speculative decoding is exact per dtype: greedy output equals plain decoding in that dtype (flip_rate.py
measures that). This measures the other question a dtype choice raises: the same checkpoint run in bf16
and in float32 is two models, and how soon their greedy outputs part is what `dtype="auto"` weighs when
it keeps a float32 checkpoint in float32 (README, "Choosing a dtype"). Per question: whether the two plain
decodes are equal, where they first differ, and float32's top-2 logit gap there (a near-tie or not).

    python benchmarks/dtype_divergence.py --per-category 3 --max-new-tokens 64 --threads 2
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import asdict
from pathlib import Path

from flip_rate import DEFAULT_QUESTIONS, first_flip


def summarize(records: list[dict]) -> dict:
    """Questions, how many parted, and the first differing positions and gaps of those that did."""
    parted = [r for r in records if r["flip"] is not None]
    positions = [r["flip"]["position"] for r in parted]
    gaps = [r["flip"]["top2_gap"] for r in parted]
    return {"questions": len(records), "parted": len(parted),
            "median_position": statistics.median(positions) if positions else None,
            "positions": sorted(positions), "median_gap": statistics.median(gaps) if gaps else None}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--questions", default=DEFAULT_QUESTIONS)
    p.add_argument("--per-category", type=int, default=3)
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--target", default=None, help="checkpoint dir (default: the embedded SmolLM2)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default="benchmarks/results/dtype_divergence")
    args = p.parse_args(argv)

    import torch
    from tqdm import tqdm

    from specdec import Engine, SamplingParams
    from specdec.bench.machine import cpu_info
    from specdec.bench.questions import load_questions
    from specdec.models.loader import load_model

    torch.set_num_threads(args.threads)
    questions = load_questions(args.questions, args.per_category)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    outputs: dict[str, dict[int, tuple[list[int], list[int]]]] = {}
    started = time.perf_counter()
    with tqdm(total=2 * len(questions), desc="dtype-divergence", unit="gen") as bar:
        for dtype in ("float32", "bfloat16"):
            engine = Engine.from_pretrained(args.target, dtype=dtype)
            outputs[dtype] = {}
            for q in questions:
                out = engine.generate(q.prompt, params, chat=True)
                outputs[dtype][q.question_id] = (out.prompt_token_ids, out.token_ids)
                bar.update()
            del engine
    gap_model = load_model(args.target, torch.float32).model  # the float32 model's margin where they part
    records = []
    for q in questions:
        prompt_ids, f32_ids = outputs["float32"][q.question_id]
        flip = first_flip(gap_model, prompt_ids, f32_ids, outputs["bfloat16"][q.question_id][1])
        records.append({"question_id": q.question_id, "category": q.category, "flip": asdict(flip) if flip else None})
    report = {"machine": cpu_info(), "command": "python " + " ".join(sys.argv), "max_new_tokens": args.max_new_tokens,
              "elapsed_s": round(time.perf_counter() - started, 1), "summary": summarize(records), "records": records}
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "report.json").write_text(json.dumps(report, indent=1))
    s = report["summary"]
    print(f"{report['machine']}\nbf16 against float32 plain greedy decoding, {args.max_new_tokens} new tokens: "
          f"{s['parted']} of {s['questions']} questions part; first differing positions {s['positions']} "
          f"(median {s['median_position']}); float32's top-2 logit gap there, median {s['median_gap']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
