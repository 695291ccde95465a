"""specdec: lossless speculative decoding, in process or served over gRPC.

    from specdec import Engine, SamplingParams
    engine = Engine.from_pretrained(drafter="ngram")
    out = engine.generate("Write a JSON object ...", SamplingParams(max_new_tokens=64))
"""
import os

# Before torch loads OpenMP: spinning worker threads make every process on a busy machine crawl
# (measured on 2 cores beside one other busy process: SmolLM2 forward 887 ms spinning, 98 ms passive).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from specdec.core.types import GenerationOutput, GenerationStats, SamplingParams
from specdec.errors import InvalidArgument, ModelNotFound, SpecdecError


def __getattr__(name):  # the engine pulls in transformers: import it only when asked for
    if name in ("Engine", "EngineConfig"):
        from specdec import engine

        return getattr(engine, name)
    raise AttributeError(name)


__all__ = ["Engine", "EngineConfig", "SamplingParams", "GenerationOutput", "GenerationStats",
           "InvalidArgument", "ModelNotFound", "SpecdecError"]
