"""What a newcomer sees first: one request decoded plainly and speculatively, side by side.

`make run` (`specdec serve --drafter suffix --demo`) sends the request through the served stack
twice: through the stack's router (router -> draft worker -> target worker), and through a second
router on the same target worker with no draft worker, which is plain decoding on the same weights
and the same process. `python -m specdec.demo` does the same in process. Both print tokens/s,
tau, acceptance and whether the two outputs are identical (greedy: they must be).

The prompt is a code fix: the answer re-emits most of the code it was given, which is where a
drafter that copies from the context (suffix decoding, prompt lookup) pays on any hardware.
"""
from __future__ import annotations

import sys
import time
from dataclasses import dataclass

from specdec.core.types import SamplingParams

PROMPT = ("Fix the typo in this Python function (`retrun` should be `return`) and output the whole corrected "
          "function, nothing else.\n\n```python\ndef parse_line(line):\n    parts = line.strip().split(\",\")\n"
          "    name = parts[0]\n    age = int(parts[1])\n    city = parts[2]\n"
          "    retrun {\"name\": name, \"age\": age, \"city\": city}\n```")
PARAMS = SamplingParams(max_new_tokens=128)


@dataclass(frozen=True)
class Run:
    """One decoding of the prompt, timed where the user sits (prefill and transport included)."""

    label: str
    token_ids: list[int]
    elapsed_s: float
    tau: float
    acceptance_rate: float
    num_target_forwards: int

    @property
    def tokens_per_s(self) -> float:
        return len(self.token_ids) / self.elapsed_s if self.elapsed_s > 0 else 0.0


def stream_run(label: str, chunks) -> Run:
    """Print a stream of chunks/events (each with .text and a final .output) and time it."""
    print(f"\n--- {label} ---", flush=True)
    start, output = time.perf_counter(), None
    for chunk in chunks:
        sys.stdout.write(chunk.text)
        sys.stdout.flush()
        output = chunk.output or output
    elapsed = time.perf_counter() - start
    s = output.stats
    print(flush=True)
    return Run(label, list(output.token_ids), elapsed, s.tau, s.acceptance_rate, s.num_target_forwards)


def comparison(plain: Run, spec: Run) -> str:
    rows = [("", plain.label, spec.label),
            ("tokens/s", f"{plain.tokens_per_s:.1f}", f"{spec.tokens_per_s:.1f}"),
            ("target forwards", str(plain.num_target_forwards), str(spec.num_target_forwards)),
            ("tau (tokens per forward)", f"{plain.tau:.2f}", f"{spec.tau:.2f}"),
            ("acceptance", "-", f"{spec.acceptance_rate:.2f}"),
            ("new tokens", str(len(plain.token_ids)), str(len(spec.token_ids)))]
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = ["  ".join(cell.ljust(w) if i == 0 else cell.rjust(w) for i, (cell, w) in enumerate(zip(row, widths)))
             for row in rows]
    speedup = spec.tokens_per_s / plain.tokens_per_s if plain.tokens_per_s else 0.0
    same = "yes" if plain.token_ids == spec.token_ids else "NO (a bug: greedy output must not change)"
    return "\n".join(lines + [f"speedup {speedup:.2f}x; identical output: {same}"])


def served(stack, drafter: str, config=None) -> tuple[Run, Run]:
    """The demo through a running stack, plus a plain router on the same target worker(s): (plain, spec).
    config: the stack's StackConfig (the plain router gets its router's security and keys)."""
    import dataclasses

    from specdec.client import Client, client_options
    from specdec.launch import spawn, wait_ready
    from specdec.serving_config import StackConfig

    config = config or StackConfig()
    plain_router = spawn("router", dataclasses.replace(
        config.router, targets=tuple(t.address for t in stack.targets), drafts=(), port=0, http_port=-1,
        metrics_port=-1))
    options = client_options(config)
    try:
        wait_ready(plain_router, 60.0)
        print(f"\nThe same request twice, greedy: through {stack.address} (router -> {drafter} draft worker -> "
              f"target worker)\nand through {plain_router.address} (a router on the same target worker, no drafter)."
              f"\n\nPrompt (one chat turn, up to {PARAMS.max_new_tokens} new tokens):\n{PROMPT}", flush=True)
        with Client(stack.address, **options) as spec_client, Client(plain_router.address, **options) as plain_client:
            warm = SamplingParams(max_new_tokens=4)  # first calls pay one-off set-up; not what we measure
            spec_client.generate("Hi", warm, chat=True, timeout_s=120)
            plain_client.generate("Hi", warm, chat=True, timeout_s=120)
            spec = stream_run(f"speculative ({drafter})", spec_client.stream(PROMPT, PARAMS, chat=True, timeout_s=300))
            plain = stream_run("plain", plain_client.stream(PROMPT, PARAMS, chat=True, timeout_s=300))
        print("\n" + comparison(plain, spec), flush=True)
        return plain, spec
    finally:
        plain_router.stop()


def main() -> int:
    """The same comparison in one process, without servers."""
    from specdec.drafters import build_drafter
    from specdec.engine import Engine, EngineConfig
    from specdec.models.loader import load_model, pick_dtype

    drafter = sys.argv[1] if len(sys.argv) > 1 else "suffix"
    dtype = pick_dtype("auto")
    target = load_model(None, dtype)
    spec = Engine(target, build_drafter(drafter, target, None, {}, dtype), EngineConfig())
    plain = Engine(target, None, EngineConfig())
    for engine in (spec, plain):  # warm-up (a different prompt, so no drafter has seen the answer)
        engine.generate("Hi", SamplingParams(max_new_tokens=4), chat=True)
    print(f"Prompt (one chat turn, greedy, up to {PARAMS.max_new_tokens} new tokens):\n{PROMPT}", flush=True)
    spec_run = stream_run(f"speculative ({drafter})", spec.stream(PROMPT, PARAMS, chat=True))
    plain_run = stream_run("plain", plain.stream(PROMPT, PARAMS, chat=True))
    print("\n" + comparison(plain_run, spec_run))
    return 0


if __name__ == "__main__":
    sys.exit(main())
