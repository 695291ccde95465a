"""Load test against any router: per concurrency level, throughput and latency as users see them.

Each level runs `num_requests` chat requests from `concurrency` client threads at once (closed loop:
a thread sends its next request when the previous one finishes), over gRPC or over the router's
OpenAI-compatible HTTP API (`specdec.loadtest_http`). Measured per request on the
client: time to first token (first streamed chunk with tokens), time per output token after it
((end - first) / (tokens - 1)), and the router's speculative statistics from the final message.
"""
from __future__ import annotations

import contextlib
import threading
import time
from dataclasses import asdict, dataclass

from specdec.core.types import SamplingParams
from specdec.loadtest_prompts import REPEATED, prompt_for

PROMPTS = REPEATED  # the eight fixed prompts (`--prompts repeated`); by default every request is its own


@dataclass(frozen=True)
class LevelResult:
    concurrency: int
    num_requests: int
    num_errors: int
    output_tokens_per_s: float
    ttft_p50_s: float
    ttft_p99_s: float
    tpot_p50_s: float
    tpot_p99_s: float
    acceptance_rate: float
    tau: float
    elapsed_s: float
    mean_batch_size: float = 0.0  # the server's sequences per verify forward during this level (0 = unknown)
    # --compare: the median over rounds of this stack's throughput over the plain stack's on the same
    # prompts (paired_speedups; 0 = not compared)
    paired_speedup: float = 0.0

    def to_dict(self) -> dict:
        return asdict(self)


def median_run(results: list[LevelResult]) -> LevelResult:
    """The run of median throughput among repeats of one level (a whole run, so its figures agree)."""
    ordered = sorted(results, key=lambda r: r.output_tokens_per_s)
    return ordered[(len(ordered) - 1) // 2]


def paired_speedups(speculative: list[LevelResult], plain: list[LevelResult]) -> list[float]:
    """Round r's speculative throughput over round r's plain one. `--compare` sends both stacks the
    same prompts in a round (and other prompts in other rounds), so a round's ratio compares like with
    like, while the two median runs may come from different rounds, whose answers differ in length."""
    return [s.output_tokens_per_s / p.output_tokens_per_s for s, p in zip(speculative, plain)
            if p.output_tokens_per_s > 0]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def _batch_counts(address: str, client_options: dict) -> tuple[int, int] | None:
    """(sequence steps, verify forwards) summed over the server's targets; None if it does not say."""
    from specdec.client import Client
    from specdec.errors import SpecdecError

    try:
        with Client(address, **client_options) as client:
            info = client.server_info()
    except SpecdecError:
        return None
    return info.num_sequence_steps, info.num_verify_forwards


def _grpc_stream(address: str, timeout_s: float, client_options: dict):
    """A user's requests over gRPC: stream(prompt, params) yields (tokens in the chunk, stats on the last)."""
    from specdec.client import Client

    client = Client(address, **client_options)

    def stream(prompt: str, params: SamplingParams):
        for chunk in client.stream(prompt, params, chat=True, timeout_s=timeout_s):
            yield len(chunk.token_ids), chunk.output.stats if chunk.output is not None else None

    return client, stream


def run_level(address: str | None, concurrency: int, num_requests: int, params: SamplingParams,
              timeout_s: float = 600.0, http_url: str | None = None, client_options: dict | None = None,
              first_index: int = 0, repeated: bool = False) -> LevelResult:
    """Requests go over gRPC to `address`, or with `http_url` over the OpenAI-compatible HTTP API (then
    `address`, if given, is only asked for the server's batch figures). client_options: the credentials
    (specdec.client.client_options), for both. Request i sends prompt_for(first_index + i, repeated):
    distinct prompts, unless `repeated` (the eight fixed ones, over and over)."""
    from specdec.loadtest_http import http_stream

    options = client_options or {}

    lock = threading.Lock()
    next_index = [0]
    ttfts, tpots, errors = [], [], []
    totals = {"tokens": 0, "drafted": 0, "accepted": 0, "forwards": 0}

    def user() -> None:
        session, stream = (http_stream(http_url, timeout_s, **options) if http_url
                           else _grpc_stream(address, timeout_s, options))
        with contextlib.closing(session):
            while True:
                with lock:
                    if next_index[0] >= num_requests:
                        return
                    index = next_index[0]
                    next_index[0] += 1
                start = time.perf_counter()
                first, n, stats = None, 0, None
                try:
                    for num_tokens, final_stats in stream(prompt_for(first_index + index, repeated), params):
                        if first is None and num_tokens:
                            first = time.perf_counter()
                        n += num_tokens
                        stats = final_stats or stats
                    if stats is None:
                        raise RuntimeError("the stream ended without its statistics")
                except Exception as exc:  # noqa: BLE001 - counted and reported, the test goes on
                    with lock:
                        errors.append(repr(exc))
                    continue
                end = time.perf_counter()
                with lock:
                    ttfts.append((first or end) - start)
                    if n > 1:
                        tpots.append((end - (first or end)) / (n - 1))
                    totals["tokens"] += n
                    totals["drafted"] += stats.num_draft_tokens
                    totals["accepted"] += stats.num_accepted_tokens
                    totals["forwards"] += stats.num_target_forwards

    counts_before = _batch_counts(address, options) if address else None
    start = time.perf_counter()
    threads = [threading.Thread(target=user, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    elapsed = time.perf_counter() - start
    counts_after = _batch_counts(address, options) if address else None
    mean_batch = 0.0
    if counts_before and counts_after and counts_after[1] > counts_before[1]:
        mean_batch = (counts_after[0] - counts_before[0]) / (counts_after[1] - counts_before[1])
    return LevelResult(
        concurrency, num_requests, len(errors), totals["tokens"] / elapsed if elapsed > 0 else 0.0,
        percentile(ttfts, 50), percentile(ttfts, 99), percentile(tpots, 50), percentile(tpots, 99),
        totals["accepted"] / totals["drafted"] if totals["drafted"] else 0.0,
        totals["tokens"] / totals["forwards"] if totals["forwards"] else 0.0, elapsed, mean_batch)


def plot(runs: dict[str, list[LevelResult]], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for label, levels in runs.items():
        ax.plot([r.concurrency for r in levels], [r.output_tokens_per_s for r in levels], marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("concurrent users")
    ax.set_ylabel("output tokens/s (all users)")
    ax.set_title("Throughput against concurrency")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
