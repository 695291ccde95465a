"""Does the load-aware budget get what it predicts? In-process continuous batching, its choices against the steps.

    .venv/bin/python benchmarks/budget_calibration.py                      # hybrid, bf16, batches of 8
    .venv/bin/python benchmarks/budget_calibration.py --drafter ngram --batch 4

The budget (specdec.policy.budget) drafts at a batch only where the kept nodes' probabilities promise more
tokens per second than plain decoding, by `min_gain`. This runs the load test's distinct prompts through
`specdec.batch.generate_batch` with the drafter, then without one, and for every step at the full batch
puts what the choice promised (extra tokens beyond one a sequence, the step's seconds from the cost table)
beside what the step got. Prints the CPU, both throughputs, and the means per kind of step (drafted,
probe, plain). A promise well above what the steps get is speculation that costs at high load.
Then the promise depth by depth (steps of two or more sequences, scored trees): at each depth the verified
nodes' probabilities summed (the tokens expected to be accepted there) against the sequences whose accepted
path reached it, which shows where a drafter's calibrated scores (specdec.policy.depth) are too sure.
"""
from __future__ import annotations

import argparse
import statistics
import time

from specdec import Engine, SamplingParams
from specdec.batch import generate_batch
from specdec.bench.machine import cpu_info
from specdec.core.tree import node_depths
from specdec.loadtest_prompts import distinct_prompt
from specdec.policy import SpeculationPolicy, node_order
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


class DepthRecorder:
    """Wraps SpeculationPolicy.allocate / record: each verified scored tree's nodes (depth, probability) and
    what its sequence accepted, for steps of two or more sequences."""

    def __init__(self):
        self.trees: list[tuple[list[tuple[int, float]], int]] = []  # ([(depth, P) per node], accepted)
        self._pending: dict[str, list[tuple[int, float]]] = {}
        self._allocate, self._record = SpeculationPolicy.allocate, SpeculationPolicy.record

    def __enter__(self) -> DepthRecorder:
        recorder, allocate, record = self, self._allocate, self._record

        def allocate_noting(policy, keys, trees, sampled, agree=None):
            out = allocate(policy, keys, trees, sampled, agree)
            recorder._pending = {}
            for key, tree in zip(keys, out):
                if len(keys) > 1 and tree.num_nodes and tree.scores is not None:
                    probs = dict(node_order(tree, policy.alpha(key), policy.scale(key)))
                    recorder._pending[key] = [(d, probs[i]) for i, d in enumerate(node_depths(tree.parent_ids))]
            return out

        def record_noting(policy, keys, trees, steps, *args, **kwargs):
            for key, step in zip(keys, steps):
                nodes = recorder._pending.pop(key, None)
                if nodes is not None and step is not None:
                    recorder.trees.append((nodes, step.num_accepted))
            return record(policy, keys, trees, steps, *args, **kwargs)

        SpeculationPolicy.allocate, SpeculationPolicy.record = allocate_noting, record_noting
        return self

    def __exit__(self, *exc) -> None:
        SpeculationPolicy.allocate, SpeculationPolicy.record = self._allocate, self._record


def by_depth(trees: list[tuple[list[tuple[int, float]], int]]) -> dict[int, tuple[float, int]]:
    """{depth: (probabilities of the verified nodes there summed, trees whose accepted path reached it)}."""
    out: dict[int, tuple[float, int]] = {}
    for nodes, accepted in trees:
        deepest = max(d for d, _ in nodes)
        for depth, p in nodes:
            promised, got = out.get(depth, (0.0, 0))
            out[depth] = (promised + p, got)
        for depth in range(1, min(accepted, deepest) + 1):
            promised, got = out[depth]
            out[depth] = (promised, got + 1)
    return dict(sorted(out.items()))


def run(drafter: str, args: argparse.Namespace) -> tuple[float, list[dict], list]:
    """(tokens per second over the run, the recorded steps, the verified trees by depth) for one drafter
    ('none': plain decoding)."""
    engine = Engine.from_pretrained(target=args.target, drafter=drafter, dtype=args.dtype)
    prompts = [distinct_prompt(i) for i in range(args.prompts + args.batch)]
    generate_batch(engine, prompts[:args.batch], SamplingParams(max_new_tokens=16), max_batch=args.batch, chat=True)
    params = SamplingParams(max_new_tokens=args.max_new_tokens, ignore_eos=True)
    with Recorder() as recorder, DepthRecorder() as depths:
        start = time.perf_counter()
        outputs = generate_batch(engine, prompts[args.batch:], params, max_batch=args.batch, chat=True)
        elapsed = time.perf_counter() - start
    return sum(map(len, outputs)) / elapsed, recorder.steps, depths.trees


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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--drafter", default="hybrid")
    p.add_argument("--target", default=None, help="checkpoint dir (default: the embedded SmolLM2-135M)")
    p.add_argument("--dtype", default="bfloat16", choices=("float32", "bfloat16"))
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--prompts", type=int, default=24)
    p.add_argument("--max-new-tokens", type=int, default=64)
    args = p.parse_args(argv)
    print(cpu_info(), f"{args.drafter} against plain, batches of {args.batch}, {args.prompts} prompts, {args.dtype}")
    spec_rate, steps, trees = run(args.drafter, args)
    plain_rate, _, _ = run("none", args)
    print(f"tokens/s: {args.drafter} {spec_rate:.0f}, plain {plain_rate:.0f} ({spec_rate / plain_rate:.2f}x)")
    full = [s for s in steps if s["batch"] == args.batch and s["plain_s"] and s["step_s"]]
    print(summary("drafted", [s for s in full if s["nodes"] and not s["probe"]], args.batch))
    print(summary("probes", [s for s in full if s["probe"]], args.batch))
    plain_steps = [s for s in full if not s["nodes"]]
    if plain_steps:
        print(f"plain steps: {len(plain_steps)}, predicted {1e3 * statistics.mean(s['plain_s'] for s in plain_steps):.1f}"
              f" ms, took {1e3 * statistics.mean(s['seconds'] for s in plain_steps):.1f}")
    print(f"by depth ({len(trees)} scored trees verified in steps of two or more sequences):")
    print("| depth | promised | got | got / promised |\n|---|---|---|---|")
    for depth, (promised, got) in by_depth(trees).items():
        print(f"| {depth} | {promised:.1f} | {got} | {got / promised:.2f} |" if promised else f"| {depth} | 0 | {got} | - |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
