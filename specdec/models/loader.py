"""Load a causal LM (and its tokenizer, when it has one) from a local checkpoint directory."""
from __future__ import annotations

import functools
import logging
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from specdec.errors import InvalidArgument, ModelNotFound

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # nothing is ever fetched from a hub at run time
os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")

log = logging.getLogger(__name__)
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


@dataclass(frozen=True)
class LoadedModel:
    model: torch.nn.Module
    tokenizer: object | None  # None for a checkpoint without tokenizer files: prompts are token ids
    path: Path


def pick_dtype(name: str, device: torch.device | None = None) -> torch.dtype:
    """'auto' is bfloat16 on a GPU (float16 on one without bf16 tensor cores); on a CPU float32, with what
    bfloat16 would do on this CPU said once (cpu_auto_dtype: the embedded target is dequantized to float32,
    and bf16 is a different target). device None: the GPU if one is visible.
    """
    if name == "auto":
        on_gpu = torch.cuda.is_available() if device is None else device.type == "cuda"
        if not on_gpu:
            return cpu_auto_dtype()
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    if name not in DTYPES:
        raise InvalidArgument(f"dtype must be auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


@functools.lru_cache(maxsize=1)
def cpu_auto_dtype() -> torch.dtype:
    """float32, said once per process with what bfloat16 would do on this CPU.

    Where the CPU multiplies bf16 natively (AVX512-BF16) specdec's kernels run it at about half the
    bytes (plain decoding ~1.5x float32's tokens/s; with AMX tiles a 16-row verify's products cost about
    a one-row step's) and, row-invariant, keep greedy speculative output
    equal to plain decoding (README, "Forward cost on CPUs"); on AVX2 alone the kernels widen bf16 to
    float32 in registers: half the bytes (plain decoding ~1.5x float32 there too), many-row verifies no
    cheaper than float32's. It stays opt-in (--dtype bfloat16) because bf16 is a different target:
    its sampling distribution is not float32's (the sampling tests' exact references are float32, and
    served outputs would change for every user), so a default switch is a product decision, not a kernel's.
    """
    from specdec.kernels.build import load_kernel

    kernel = load_kernel()
    if kernel.isa == "amx_bf16":
        log.info("dtype auto: float32 on a CPU (this one runs bfloat16 on AMX tiles through specdec's kernels: "
                 "--dtype bfloat16 for ~1.8x the tokens/s, and verify forwards about as cheap as one token)")
    elif kernel.native_bf16:
        log.info("dtype auto: float32 on a CPU (this one runs bfloat16 natively through specdec's kernels: "
                 "--dtype bfloat16 for ~1.5x the tokens/s)")
    elif kernel.runs_bf16:
        log.info("dtype auto: float32 on a CPU (specdec's kernels run bfloat16 here widened to float32 on %s: "
                 "--dtype bfloat16 reads half the bytes a token)", kernel.isa)
    else:
        log.info("dtype auto: float32 on a CPU (no native bfloat16 here: %s)",
                 kernel.reason or f"specdec's kernels run {kernel.isa}")
    return torch.float32


def resolve_path(path: str | os.PathLike | None) -> Path:
    """None means the embedded default target; anything else must be a checkpoint directory."""
    if path is None:
        from specdec.models.embedded import embedded_target_path

        return embedded_target_path()
    resolved = Path(path).expanduser()
    if not resolved.is_dir():
        raise ModelNotFound(f"model path {str(path)!r} does not exist or is not a directory")
    if not (resolved / "config.json").is_file():
        raise ModelNotFound(f"model path {str(path)!r} has no config.json (not a Hugging Face checkpoint)")
    return resolved


def load_model(path: str | os.PathLike | None, dtype: torch.dtype, tp_degree: int = 1,
               device: torch.device | str = "cpu") -> LoadedModel:
    """tp_degree > 1: split the model over the current torch.distributed group (transformers' tp_plan;
    on GPUs each rank's shard goes to cuda:LOCAL_RANK). device: where the weights go (loaded straight
    there, never staged whole in host memory first)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    resolved = resolve_path(path)
    check_plain_kv_cache(resolved)
    try:
        placement = {"tp_plan": "auto"} if tp_degree > 1 else (
            {"device_map": str(device)} if torch.device(device).type != "cpu" else {})
        model = AutoModelForCausalLM.from_pretrained(
            resolved, dtype=dtype, local_files_only=True, attn_implementation="sdpa", **placement)
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"cannot load a causal LM from {str(resolved)!r}: {str(exc).splitlines()[0]}") from exc
    model.eval().requires_grad_(False)
    try:
        tokenizer = AutoTokenizer.from_pretrained(resolved, local_files_only=True)
    except (OSError, ValueError, TypeError):
        tokenizer = None
    return LoadedModel(model, tokenizer, resolved)


def check_plain_kv_cache(path: Path) -> None:
    """Refuse, before loading any weights, a model whose KV cache is not plain full attention in every layer.

    A verify step is committed by keeping cache positions [0, start) plus the accepted rows and
    dropping the rest (core/kv.py); rollback crops positions. That is only right when every layer
    keeps one key/value entry per token: a sliding-window or chunked layer drops old positions, and
    a linear-attention (recurrent) layer folds every token into one state that slicing cannot undo,
    so speculation would silently corrupt them.
    """
    from transformers import AutoConfig, DynamicCache
    from transformers.cache_utils import DynamicLayer

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"cannot read the config of {str(path)!r}: {str(exc).splitlines()[0]}") from exc
    config = getattr(config, "get_text_config", lambda: config)()
    try:
        layers = DynamicCache(config=config).layers
    except Exception as exc:  # noqa: BLE001 (any failure means the cache is not the plain kind)
        raise InvalidArgument(f"{str(path)!r}: cannot build a KV cache for this model ({exc}); specdec "
                              f"serves models whose every layer is plain full attention") from exc
    odd = [i for i, layer in enumerate(layers) if type(layer) is not DynamicLayer]
    if odd:
        kinds = _layer_kinds(config, layers)
        found = ", ".join(sorted({kinds[i] for i in odd}))
        raise InvalidArgument(f"{str(path)!r} ({config.model_type}) has {len(odd)} of {len(layers)} layers with a "
                              f"{found} cache; specdec commits verified tokens by slicing cache positions and "
                              f"serves only models whose every layer is plain full attention")


def _layer_kinds(config, layers) -> list[str]:
    """Each layer's attention kind as transformers names it (sliding_attention, linear_attention, ...)."""
    try:
        from transformers.cache_utils import get_layer_types_and_kwargs

        kinds = list(get_layer_types_and_kwargs(config)[0])
        if len(kinds) == len(layers):
            return kinds
    except Exception:  # noqa: BLE001 (names are only for the message)
        pass
    return [type(layer).__name__ for layer in layers]


def random_draft_path(target: LoadedModel, seed: int = 0) -> Path:
    """A tiny random Llama sharing the target's vocabulary (what draft="random" asks for; tests only).

    It exercises the whole draft-model path (its own KV cache, rollback, trees) at near-zero
    acceptance, which is also what the adaptive controller must survive. Its weights come from a
    local generator seeded with `seed`, and the global torch RNG is left as it was: building it
    must not change what a caller's own torch.manual_seed(...) draws next.
    """
    from transformers import LlamaConfig, LlamaForCausalLM

    from specdec.models.embedded import cache_dir

    vocab_size = target.model.config.vocab_size
    out = cache_dir() / f"random-draft-v{vocab_size}-g{seed}"
    if (out / "config.json").is_file():
        return out
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128, num_hidden_layers=1,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=8192,
                         tie_word_embeddings=True)
    with torch.random.fork_rng(devices=[]):  # the constructor's own init draws from the global RNG
        model = LlamaForCausalLM(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # norms start at 1, matrices ~ N(0, initializer_range)
            if name.endswith("norm.weight"):
                param.fill_(1.0)
            else:
                param.normal_(0.0, config.initializer_range, generator=generator)
    model.save_pretrained(out)
    if target.tokenizer is not None:
        target.tokenizer.save_pretrained(out)
    return out
