"""What a long prompt arriving costs the streams already running: time per output token (TPOT) of a
running stream before and while an 8,000-token prompt is prefilled, its longest gap, and the long
prompt's time to first token.

    .venv/bin/python benchmarks/prefill_interference.py                        # embedded SmolLM2
    .venv/bin/python benchmarks/prefill_interference.py --prefill-chunk-tokens 128 --json

Router and target worker as separate processes on 127.0.0.1, no draft worker (plain decoding:
what is measured is prefill against decoding, not speculation). Greedy. On a tree without chunked
prefill (TargetConfig has no prefill_chunk_tokens) the flag is ignored: the prompt is prefilled in
one forward, which is the "before" of the README's table.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

from specdec.client import Client  # noqa: E402
from specdec.core.types import SamplingParams  # noqa: E402
from specdec.launch import start_stack  # noqa: E402
from specdec.serving_config import RouterConfig, StackConfig, TargetConfig  # noqa: E402

RUNNING_PROMPT = "Write a long story about a lighthouse keeper and the sea, chapter by chapter."


def long_prompt(num_tokens: int) -> list[int]:
    """Ordinary token ids (no specials), deterministic: the content does not change the cost."""
    return [1000 + (i * 7919) % 30000 for i in range(num_tokens)]


def measure(address: str, num_prompt_tokens: int, warm_tokens: int) -> dict:
    arrivals, long_done = [], {}

    def send_long(client) -> None:
        start = time.monotonic()
        for chunk in client.stream(long_prompt(num_prompt_tokens), SamplingParams(max_new_tokens=4, ignore_eos=True),
                                   timeout_s=900):
            long_done.setdefault("first_token_at", time.monotonic())
        long_done.update(ttft_s=long_done["first_token_at"] - start, done=True)

    with Client(address) as client:
        num_tokens, sent_at, sender = 0, None, None
        for chunk in client.stream(RUNNING_PROMPT, SamplingParams(max_new_tokens=4000, ignore_eos=True), chat=True,
                                   timeout_s=900):
            num_tokens += len(chunk.token_ids)
            arrivals.append((time.monotonic(), num_tokens))
            if sender is None and num_tokens >= warm_tokens:
                sent_at = time.monotonic()
                sender = threading.Thread(target=send_long, args=(client,))
                sender.start()
            if long_done.get("done"):
                break
        sender.join()
    before = [(t, n) for t, n in arrivals if t <= sent_at][-warm_tokens // 2:]  # warmed up, alone
    during = [(t, n) for t, n in arrivals if sent_at - 1e-3 <= t <= long_done["first_token_at"]]
    gaps = [b[0] - a[0] for a, b in zip(during, during[1:])]
    return {"tpot_before_s": _tpot(before), "tpot_during_s": _tpot(during), "max_gap_s": max(gaps, default=0.0),
            "median_gap_s": statistics.median(gaps) if gaps else 0.0, "long_prompt_ttft_s": long_done["ttft_s"],
            "tokens_during_prefill": during[-1][1] - during[0][1] if during else 0}


def _tpot(points: list[tuple[float, int]]) -> float:
    if len(points) < 2:
        return float("nan")
    return (points[-1][0] - points[0][0]) / (points[-1][1] - points[0][1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--target", default=None, help="target checkpoint (default: embedded SmolLM2-135M)")
    parser.add_argument("--prompt-tokens", type=int, default=8000)
    parser.add_argument("--prefill-chunk-tokens", type=int, default=None, help="default: the target's own")
    parser.add_argument("--warm-tokens", type=int, default=24, help="running tokens before the long prompt is sent")
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--num-threads", type=int, default=1,
                        help="the target's torch threads (1: on a shared 2-core CPU more threads only contend)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    fields = {f.name for f in dataclasses.fields(TargetConfig)}
    target = {"model": args.target, "dtype": args.dtype, "num_threads": args.num_threads}
    if args.prefill_chunk_tokens is not None and "prefill_chunk_tokens" in fields:
        target["prefill_chunk_tokens"] = args.prefill_chunk_tokens
    chunked = "prefill_chunk_tokens" in fields
    config = StackConfig(router=RouterConfig(http_port=-1), targets=(TargetConfig(**target),), drafts=(),
                         ready_timeout_s=300)
    stack = start_stack(config, env={"OMP_NUM_THREADS": str(args.num_threads)})
    try:
        result = measure(stack.address, args.prompt_tokens, args.warm_tokens)
    finally:
        stack.stop()
    result["prefill"] = (f"chunks of {TargetConfig(**target).prefill_chunk_tokens} tokens" if chunked
                         else "one forward")
    if args.json:
        print(json.dumps(result))
    else:
        print(f"prefill: {result['prefill']}; running stream TPOT {result['tpot_before_s'] * 1e3:.0f} ms alone, "
              f"{result['tpot_during_s'] * 1e3:.0f} ms while a {args.prompt_tokens}-token prompt is prefilled "
              f"(longest gap {result['max_gap_s']:.2f} s, {result['tokens_during_prefill']} tokens meanwhile); "
              f"the long prompt's first token after {result['long_prompt_ttft_s']:.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
