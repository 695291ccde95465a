"""Whole target forwards of two source trees taking turns: ms per forward by row count, and rows / one row.

    git -C /work/main worktree add /tmp/wt-old <old commit>
    .venv/bin/python benchmarks/forward_ab.py --trees /tmp/wt-old . --dtype bfloat16 --context 1024

forward_cost.py's "8 / 1 row" is the fastest 8-row forward over the fastest one-row forward, each of a few
repeats; on a shared VM whose memory runs at one rate for a minute and another the next, the two bests can
come from different minutes, and the ratio moved 1.16-1.27 between runs of one tree here. This measures a
ratio where drift cannot reach it: each tree's worker process loads the model once, fills a KV cache of
`--context` tokens, and on its turn runs `--forwards` forwards of each row count (the same
cache, rolled back after each), row counts interleaved, after `--warmup` untimed rounds: the other tree's
model has just displaced this one's weights from L3 (a bf16 SmolLM2 is about the size of this Xeon's L3),
and without them a turn's first forwards read the weights from memory. The turn's medians give its ratios,
and the median over turns is the figure.
The two trees alternate turn by turn (and which goes first), so drift hits both alike; B / A compares their
one-row times too. A forward is forward_cost's: the causal rows through the decoder, then the LM head over
every row. Both trees' logits of one forward of the most rows are compared bit for bit first.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

from tqdm import tqdm


def worker(tree: str, conn, args: argparse.Namespace) -> None:
    """In the child: this tree's specdec and forward_cost helpers, one model and one filled cache."""
    sys.path[:0] = [tree, str(Path(tree) / "benchmarks")]
    import torch

    from forward_cost import causal_bias, filled_cache, runner_config
    from specdec.models.loader import DTYPES, load_model
    from specdec.models.runner import ModelRunner

    if args.threads:
        torch.set_num_threads(args.threads)
    runner = ModelRunner(load_model(args.target, DTYPES[args.dtype]).model, config=runner_config("specdec"))
    cache = filled_cache(runner, 1, args.context)
    generator = torch.Generator().manual_seed(1)
    inputs = {rows: (torch.randint(0, runner.vocab_size, (1, rows), generator=generator),
                     torch.arange(args.context, args.context + rows).unsqueeze(0),
                     causal_bias(1, rows, args.context, runner.dtype)) for rows in args.rows}

    def forward(rows: int) -> torch.Tensor:
        ids, positions, bias = inputs[rows]
        with torch.inference_mode():
            hidden = runner.forward_batch(ids, cache, bias, positions)
            logits = runner.logits(hidden.reshape(rows, -1))
        cache.trim(args.context)
        return logits

    conn.send(forward(max(args.rows)).float())
    while conn.recv():
        seconds: dict[int, list[float]] = {rows: [] for rows in args.rows}
        for round_ in range(args.warmup + args.forwards):
            for rows in args.rows:  # one of each a round: every row count sees the caches in the same state
                start = time.perf_counter()
                forward(rows)
                if round_ >= args.warmup:
                    seconds[rows].append(time.perf_counter() - start)
        conn.send({rows: statistics.median(s) for rows, s in seconds.items()})


def one_pair(args: argparse.Namespace) -> tuple[list[dict], list[dict], bool]:
    """Each tree's turns ({rows: median seconds} per turn) for one pair of workers, and whether logits matched."""
    import torch

    from ab_turns import take_turns

    first, turns = take_turns(worker, args, args.turns)
    return turns[0], turns[1], torch.equal(first[0], first[1])


def summary(turns: list[dict], rows: list[int]) -> dict[int, tuple[float, float]]:
    """{rows: (median ms per forward, median over turns of the turn's rows / one-row ratio)}."""
    base = min(rows)
    return {r: (1e3 * statistics.median(t[r] for t in turns), statistics.median(t[r] / t[base] for t in turns))
            for r in rows}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", nargs=2, required=True, metavar=("A", "B"), help="two source trees")
    parser.add_argument("--target", default=None, help="checkpoint dir (default: the embedded SmolLM2-135M)")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="bfloat16")
    parser.add_argument("--context", type=int, default=1024, help="cached tokens before the new rows")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 8, 16], help="row counts (the least is the base)")
    parser.add_argument("--forwards", type=int, default=9, help="timed rounds a turn (a forward of each row count)")
    parser.add_argument("--warmup", type=int, default=3, help="untimed rounds first (the other tree's model has "
                        "just displaced this one's weights from the caches)")
    parser.add_argument("--turns", type=int, default=8, help="turns per pair of workers")
    parser.add_argument("--pairs", type=int, default=2, help="pairs of worker processes, one after the other")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0 = torch's default)")
    parser.add_argument("--allow-different", action="store_true", help="B may change the logits' bits")
    args = parser.parse_args(argv)
    if args.context < 1 or args.forwards < 1 or args.turns < 1 or args.pairs < 1 or min(args.rows) < 1 \
            or args.warmup < 0:
        parser.error("--context, --forwards, --turns, --pairs and every --rows must be >= 1, --warmup >= 0")
    args.rows = sorted(set(args.rows))
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the workers find this module by name
    from ab_turns import bits_verdict
    from specdec.bench.machine import machine_info

    info = machine_info()
    print(f"CPU: {info.get('cpu')}; flags: {', '.join(info.get('cpu_flags', []))}; {args.dtype}, "
          f"{args.context} cached, rows {' '.join(map(str, args.rows))}, {args.forwards} timed rounds a turn")
    results = [one_pair(args) for _ in tqdm(range(args.pairs), desc="pairs", file=sys.stderr)]
    a_turns = [t for a, _, _ in results for t in a]
    b_turns = [t for _, b, _ in results for t in b]
    a, b = summary(a_turns, args.rows), summary(b_turns, args.rows)
    base = args.rows[0]
    print(f"| rows | A ms | B ms | B / A | A rows / {base} | B rows / {base} |\n|---|---|---|---|---|---|")
    for r in args.rows:
        print(f"| {r} | {a[r][0]:.2f} | {b[r][0]:.2f} | {b[r][0] / a[r][0]:.3f} | {a[r][1]:.3f} | {b[r][1]:.3f} |")
    return bits_verdict([same for _, _, same in results], args.allow_different,
                        "forward_ab: A and B gave different logits")


if __name__ == "__main__":
    sys.exit(main())
