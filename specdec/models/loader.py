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


def pick_dtype(name: str, device: torch.device | None = None, *, target: str | os.PathLike | None = None,
               linear_kernel: str = "auto", kv_cache: str = "static", tp_degree: int = 1) -> torch.dtype:
    """'auto' is bfloat16 on a GPU (float16 on one without bf16 tensor cores). On a CPU it is bfloat16 for a
    checkpoint stored in bfloat16 where that is native and exact here (cpu_auto_dtype), else float32; the
    choice and its reason are logged once. target (None: the embedded default), linear_kernel, kv_cache and
    tp_degree say how the model will run; its config is read before any weight loads. device None: the GPU
    if one is visible.
    """
    if name == "auto":
        on_gpu = torch.cuda.is_available() if device is None else device.type == "cuda"
        if not on_gpu:
            return cpu_auto_dtype(str(resolve_path(target)), linear_kernel, kv_cache, tp_degree)
        return torch.bfloat16 if torch.cuda.is_bf16_supported(including_emulation=False) else torch.float16
    if name not in DTYPES:
        raise InvalidArgument(f"dtype must be auto, {', '.join(DTYPES)}; got {name!r}")
    return DTYPES[name]


@functools.lru_cache(maxsize=None)
def cpu_auto_dtype(target: str, linear_kernel: str = "auto", kv_cache: str = "static",
                   tp_degree: int = 1) -> torch.dtype:
    """bfloat16 or float32 for the checkpoint at `target` on this CPU, said once per model and way of running it.

    bfloat16 where it is the model's own dtype, pays and stays exact. Own: the checkpoint is stored in
    bf16, so nothing is rounded (a float32 checkpoint, the embedded Q4_1 target dequantized included, stays
    float32: bf16 would round its weights to 8 bits of mantissa, a different model whose greedy tokens
    part from float32's within 64 tokens on most questions). Pays: the CPU multiplies bf16 natively
    (AVX512-BF16's `vdpbf16ps`, or AMX tiles), where specdec's kernels read half float32's bytes a
    token (plain decoding ~1.5x float32's tokens/s with AVX512-BF16, 1.8-2.3x with AMX); on AVX2 alone they
    widen bf16 in registers and a many-row verify costs what float32's does. Exact: greedy speculative
    output equals plain decoding only where every product is row-invariant, i.e. the model runs specdec's
    kernels and lean forward (a Llama-family model, one process, the static cache); torch's bf16 kernels
    parted the two on 5-6 of 6 questions. `--dtype bfloat16` asks for bf16 anywhere.
    """
    from transformers import AutoConfig

    from specdec.kernels.build import load_kernel
    from specdec.kernels.lean import why_not_config
    from specdec.kernels.linear import choose

    try:
        config = AutoConfig.from_pretrained(target, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise ModelNotFound(f"cannot read the config of {target!r}: {str(exc).splitlines()[0]}") from exc
    config = getattr(config, "get_text_config", lambda: config)()
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    stored = getattr(torch, stored) if isinstance(stored, str) and hasattr(torch, stored) else stored
    kernel = load_kernel()
    if stored != torch.bfloat16:
        reason = (f"its checkpoint is stored in {str(stored or 'float32').removeprefix('torch.')}: bf16 would round "
                  f"its weights" + (" (--dtype bfloat16 for about half the bytes a token, natively here)"
                                    if kernel.native_bf16 else ""))
    elif not kernel.native_bf16:
        reason = (f"no native bfloat16 here: specdec's kernels run {kernel.isa}" if kernel.module is not None
                  else f"no native bfloat16 kernels here: {kernel.reason}")
    elif (choice := choose(linear_kernel, torch.device("cpu"), torch.bfloat16, tp_degree > 1)).kernel != "specdec":
        reason = f"its linear layers would run on torch's kernels ({choice.reason}), not row-invariant in bf16"
    elif kv_cache != "static":
        reason = f"kv_cache {kv_cache} keeps transformers' walk, not specdec's lean forward"
    else:
        reason = why_not_config(config, torch.bfloat16)
    if reason:
        log.info("dtype auto: float32 for %s (%s)", target, reason)
        return torch.float32
    how = "AMX tiles" if kernel.isa == "amx_bf16" else "AVX512-BF16"
    log.info("dtype auto: bfloat16 for %s (its checkpoint's own dtype; this CPU multiplies it natively, %s, on "
             "specdec's row-invariant kernels)", target, how)
    return torch.bfloat16


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
