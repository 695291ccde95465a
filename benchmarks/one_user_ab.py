"""One user in process, plain against a speculative engine, on the load test's distinct prompts: where a
speculative step's time goes (verify forward, drafting) beside a plain step's.

    python benchmarks/one_user_ab.py                      # hybrid against plain, float32, 3 rounds
    python benchmarks/one_user_ab.py --dtype bfloat16 --drafter ngram --rounds 5

What `specdec loadtest --compare` does at one user, without the router and gRPC: both engines first answer
`--warmup` prompts (kernels, caches, the policy's costs, suffix decoding's store), then each round gives both
the same `--prompts-per-round` new prompts, plain first in even rounds and second in odd ones. Per round:
the speedup, plain and speculative tokens/s, tau (tokens per target forward), the nodes verified per step,
the verify forward's and drafting's milliseconds per step, a whole step's against a plain step's (prefill
included in both), and whether the tokens equal plain decoding's (greedy: they must).
"""
from __future__ import annotations

import argparse

from specdec import Engine, SamplingParams
from specdec.bench.machine import cpu_info
from specdec.loadtest_prompts import distinct_prompt


def run_round(engine: Engine, prompts: list[str], params: SamplingParams) -> dict:
    outs = [engine.generate(prompt, params, chat=True) for prompt in prompts]
    stats = [o.stats for o in outs]
    tokens = sum(s.num_new_tokens for s in stats)
    forwards = sum(s.num_target_forwards for s in stats)
    elapsed = sum(s.elapsed_s for s in stats)
    return dict(tok_s=tokens / elapsed, tau=tokens / forwards,
                nodes=sum(s.num_draft_tokens for s in stats) / forwards,
                verify_ms=1e3 * sum(s.verify_s for s in stats) / forwards,
                draft_ms=1e3 * sum(s.draft_s for s in stats) / forwards,
                step_ms=1e3 * elapsed / forwards, token_ids=[o.token_ids for o in outs])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="hybrid")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--warmup", type=int, default=16)
    p.add_argument("--prompts-per-round", type=int, default=16)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    print(cpu_info(), flush=True)
    plain = Engine.from_pretrained(target=None, drafter="none", dtype=args.dtype)
    spec = Engine.from_pretrained(target=None, drafter=args.drafter, dtype=args.dtype)
    params = SamplingParams(max_new_tokens=args.max_new_tokens)
    warmup = [distinct_prompt(i) for i in range(args.warmup)]
    for engine in (plain, spec):
        run_round(engine, warmup, params)
    for r in range(args.rounds):
        first = args.warmup + r * args.prompts_per_round
        prompts = [distinct_prompt(first + i) for i in range(args.prompts_per_round)]
        if r % 2 == 0:  # the order alternates, so a machine that drifts within a round favours neither
            base, ours = run_round(plain, prompts, params), run_round(spec, prompts, params)
        else:
            ours, base = run_round(spec, prompts, params), run_round(plain, prompts, params)
        print(f"round {r}: {ours['tok_s'] / base['tok_s']:.2f}x  plain {base['tok_s']:.1f} tok/s  "
              f"{args.drafter} {ours['tok_s']:.1f} tok/s  tau {ours['tau']:.2f}  nodes/step {ours['nodes']:.1f}  "
              f"verify {ours['verify_ms']:.1f} ms  drafting {ours['draft_ms']:.2f} ms  step {ours['step_ms']:.1f} ms "
              f"(plain {base['step_ms']:.1f})  same {ours['token_ids'] == base['token_ids']}", flush=True)


if __name__ == "__main__":
    main()
