"""specdec: lossless speculative decoding, in process or served over gRPC.

    from specdec import Engine, SamplingParams
    engine = Engine.from_pretrained(drafter="ngram")
    out = engine.generate("Write a JSON object ...", SamplingParams(max_new_tokens=64))
"""
from specdec.core.types import GenerationOutput, GenerationStats, SamplingParams
from specdec.errors import InvalidArgument, ModelNotFound, SpecdecError


def __getattr__(name):  # the engine pulls in transformers: import it only when asked for
    if name in ("Engine", "EngineConfig"):
        from specdec import engine

        return getattr(engine, name)
    raise AttributeError(name)


__all__ = ["Engine", "EngineConfig", "SamplingParams", "GenerationOutput", "GenerationStats",
           "InvalidArgument", "ModelNotFound", "SpecdecError"]
