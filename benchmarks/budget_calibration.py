"""Does the load-aware budget get what it predicts? In-process continuous batching, its choices against the steps.

    .venv/bin/python benchmarks/budget_calibration.py                      # hybrid, bf16, batches of 8
    .venv/bin/python benchmarks/budget_calibration.py --drafter ngram --batch 4

The budget (specdec.policy.budget) drafts at a batch only where the kept nodes' probabilities promise more
tokens per second than plain decoding, by `min_gain`. This runs the load test's distinct prompts through
`specdec.batch.generate_batch` with the drafter, then without one, and for every step at the full batch
puts what the choice promised (extra tokens beyond one a sequence, the step's seconds from the cost table)
beside what the step got. Prints the CPU, both throughputs, and the means per kind of step (drafted,
probe, plain). A promise well above what the steps get is speculation that costs at high load.
"""
from __future__ import annotations

import argparse
import statistics
import time

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.bench.machine import cpu_info
from specdec.loadtest_prompts import distinct_prompt
from specdec.policy import budget as budget_module


class Recorder:
    """Wraps BatchBudget.choose_each / record for one run: each step's promise, then its outcome."""

    def __init__(self):
        self.steps: list[dict] = []
        self._pending: dict | None = None
        self._choose, self._record = budget_module.BatchBudget.choose_each, budget_module.BatchBudget.record

    def __enter__(self) -> Recorder:
        recorder, choose, record = self, self._choose, self._record

        def choose_each(budget, orders, batch, explore=None):
            counts = choose(budget, orders, batch, explore)
            nodes = sum(counts)
            promised = sum(sum(order[:count]) for order, count in zip(orders, counts))  # each tree keeps a prefix
            plain_s, step_s = budget.estimate_many(batch, [batch, batch + nodes])
            recorder._pending = dict(batch=batch, nodes=nodes, promised=promised, plain_s=plain_s, step_s=step_s,
                                     probe=budget.probe_expected is not None)
            return counts

        def record_step(budget, num_rows, seconds, num_tokens, batch):
            if recorder._pending is not None and seconds is not None:
                recorder.steps.append({**recorder._pending, "got": num_tokens - batch, "seconds": seconds})
            recorder._pending = None
            return record(budget, num_rows, seconds, num_tokens, batch)

        budget_module.BatchBudget.choose_each = choose_each
        budget_module.BatchBudget.record = record_step
        return self

    def __exit__(self, *exc) -> None:
        budget_module.BatchBudget.choose_each, budget_module.BatchBudget.record = self._choose, self._record


def run(drafter: str, args: argparse.Namespace) -> tuple[float, list[dict]]:
    """(tokens per second over the run, the recorded steps) for one drafter ('none': plain decoding)."""
    engine = Engine.from_pretrained(target=None, drafter=drafter, dtype=args.dtype)
    prompts = [distinct_prompt(i) for i in range(args.prompts + args.batch)]
    generate_batch(engine, prompts[:args.batch], SamplingParams(max_new_tokens=16), max_batch=args.batch, chat=True)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    with Recorder() as recorder:
        start = time.perf_counter()
        outputs = generate_batch(engine, prompts[args.batch:], params, max_batch=args.batch, chat=True)
        elapsed = time.perf_counter() - start
    return sum(map(len, outputs)) / elapsed, recorder.steps


def summary(name: str, steps: list[dict], batch: int) -> str:
    if not steps:
        return f"{name}: none"
    mean = lambda key: statistics.mean(s[key] for s in steps)  # noqa: E731
    promised_rate = (batch + mean("promised")) / mean("step_s") / (batch / mean("plain_s"))
    got_rate = (batch + mean("got")) / mean("seconds") / (batch / mean("plain_s"))
    return (f"{name}: {len(steps)} steps, {mean('nodes'):.1f} nodes; extra tokens promised {mean('promised'):.2f}, "
            f"got {mean('got'):.2f}; seconds predicted {1e3 * mean('step_s'):.1f} ms, took {1e3 * mean('seconds'):.1f} "
            f"(plain predicted {1e3 * mean('plain_s'):.1f}); rate against plain's prediction: promised "
            f"{promised_rate:.2f}x, got {got_rate:.2f}x")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="hybrid")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args()
    print(cpu_info(), f"{args.drafter} against plain, batches of {args.batch}, {args.prompts} prompts, {args.dtype}")
    spec_rate, steps = run(args.drafter, args)
    plain_rate, _ = run("none", args)
    print(f"tokens/s: {args.drafter} {spec_rate:.0f}, plain {plain_rate:.0f} ({spec_rate / plain_rate:.2f}x)")
    full = [s for s in steps if s["batch"] == args.batch and s["plain_s"] and s["step_s"]]
    print(summary("drafted", [s for s in full if s["nodes"] and not s["probe"]], args.batch))
    print(summary("probes", [s for s in full if s["probe"]], args.batch))
    plain_steps = [s for s in full if not s["nodes"]]
    if plain_steps:
        print(f"plain steps: {len(plain_steps)}, predicted {1e3 * statistics.mean(s['plain_s'] for s in plain_steps):.1f}"
              f" ms, took {1e3 * statistics.mean(s['seconds'] for s in plain_steps):.1f}")


if __name__ == "__main__":
    main()
