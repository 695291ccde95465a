"""`make run`'s in-process demo: stream one copy-heavy prompt with prompt lookup, then time plain
decoding on the same prompt and print the speedup and tau (and that the tokens are identical)."""
from __future__ import annotations

import sys

from specdec.core.types import SamplingParams
from specdec.drafters import build_drafter
from specdec.engine import Engine, EngineConfig
from specdec.models.loader import load_model, pick_dtype

PROMPT = ('Repeat the following JSON exactly, then say "done": {"model": "SmolLM2-135M-Instruct", '
          '"method": "speculative decoding", "drafter": "prompt lookup", "lossless": true}')


def main() -> int:
    dtype = pick_dtype("auto")
    target = load_model(None, dtype)
    spec = Engine(target, build_drafter("ngram", target, None, {}, dtype), EngineConfig())
    plain = Engine(target, None, EngineConfig())
    params = SamplingParams(max_new_tokens=96)
    plain.generate("Hi", SamplingParams(max_new_tokens=4), chat=True)  # warm-up
    print(f"prompt: {PROMPT}\n\nspecdec (prompt lookup) streaming:\n", flush=True)
    for event in spec.stream(PROMPT, params, chat=True):
        sys.stdout.write(event.text)
        sys.stdout.flush()
        if event.output is not None:
            spec_out = event.output
    base = plain.generate(PROMPT, params, chat=True)
    s, b = spec_out.stats, base.stats
    print(f"\n\nprompt lookup: {s.tokens_per_s:.1f} tok/s, tau {s.tau:.2f}, acceptance {s.acceptance_rate:.2f}")
    print(f"plain decoding: {b.tokens_per_s:.1f} tok/s")
    print(f"speedup {s.tokens_per_s / b.tokens_per_s:.2f}x; identical tokens: {spec_out.token_ids == base.token_ids}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
