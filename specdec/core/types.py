"""Plain data shared by every layer: sampling parameters and generation results."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

from specdec.errors import InvalidArgument

# Sampling temperatures other than 0 (greedy) must lie in this range. Logits are divided by the
# temperature in float32: below ~1e-38 that overflows to inf and the softmax to NaN, and long before
# that the distribution is greedy in all but name; far above 100 every token ties and top-k / top-p
# stop meaning anything. Refusing is exact; clamping would silently sample another distribution.
MIN_TEMPERATURE = 1e-2
MAX_TEMPERATURE = 100.0


# The KV cache kinds a model runner offers (specdec.models.runner): "static" is preallocated and
# committed by index bookkeeping (specdec.models.static_cache), "dynamic" is transformers'
# DynamicCache (grown by concatenation, cropped by slicing). The README's "KV cache" section has the
# measurement that made static the default.
KV_CACHES = ("static", "dynamic")
DEFAULT_KV_CACHE = "static"
DEFAULT_PREFIX_CACHE_MB = 128  # a target's prompt-prefix cache (specdec.models.prefix_cache): ~2,800 float32 SmolLM2 tokens


# Which kernel runs a model's linear layers (specdec.kernels.linear): "specdec" is the project's own
# row-invariant multi-row matmul (specdec/kernels/rowgemm.cpp, CPUs only), "torch" is F.linear, "auto"
# is specdec's where it runs (a CPU, no tensor parallelism, the extension built, the dtype supported)
# and torch's elsewhere. The README's "Forward cost on CPUs" section has the measurement behind it.
LINEAR_KERNELS = ("auto", "specdec", "torch")
DEFAULT_LINEAR_KERNEL = "auto"


def check_linear_kernel(kind) -> str:
    """The one rule for a linear_kernel option (engine, CLI, serving configs)."""
    if kind not in LINEAR_KERNELS:
        raise InvalidArgument(f"linear_kernel must be one of {', '.join(LINEAR_KERNELS)}; got {kind!r}")
    return kind


def check_kv_cache(kind) -> str:
    """The one rule for a kv_cache option (engine, CLI, serving configs): one line naming the kinds."""
    if kind not in KV_CACHES:
        raise InvalidArgument(f"kv_cache must be one of {', '.join(KV_CACHES)}; got {kind!r}")
    return kind


def check_device_name(name) -> str:
    """The one rule for a `device` option's spelling: auto, cpu, cuda or cuda:N (whether that device
    exists is specdec.device's question, asked where torch is loaded)."""
    ok = isinstance(name, str) and (name in ("auto", "cpu", "cuda") or (
        name.startswith("cuda:") and name[5:].isdigit()))
    if not ok:
        raise InvalidArgument(f"device must be auto, cpu, cuda or cuda:N; got {name!r}")
    return name


def check_temperature(temperature) -> None:
    """The one temperature rule (the engine, the router and the CLI all refuse with this message)."""
    if (not isinstance(temperature, (int, float)) or not math.isfinite(temperature)
            or not (temperature == 0 or MIN_TEMPERATURE <= temperature <= MAX_TEMPERATURE)):
        raise InvalidArgument(f"temperature must be 0 (greedy) or in [{MIN_TEMPERATURE:g}, {MAX_TEMPERATURE:g}], "
                              f"got {temperature}")


@dataclass(frozen=True)
class SamplingParams:
    """How to pick tokens. temperature 0 is greedy; top_k 0 and top_p 1 disable those filters."""

    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int | None = None
    max_new_tokens: int = 128
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False

    def __post_init__(self) -> None:
        check_temperature(self.temperature)
        if not isinstance(self.top_p, (int, float)) or not 0.0 < self.top_p <= 1.0:
            raise InvalidArgument(f"top_p must be in (0, 1], got {self.top_p}")
        if not isinstance(self.top_k, int) or self.top_k < 0:
            raise InvalidArgument(f"top_k must be >= 0 (0 disables it), got {self.top_k}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens <= 0:
            raise InvalidArgument(f"max_new_tokens must be > 0, got {self.max_new_tokens}")
        if self.seed is not None and (not isinstance(self.seed, int) or self.seed < 0):
            raise InvalidArgument(f"seed must be a non-negative integer, got {self.seed}")
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise InvalidArgument("stop strings must be non-empty strings")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


@dataclass(frozen=True)
class GenerationStats:
    """Speculative statistics of one generation. tau = tokens emitted per target forward (plain
    decoding: 1.0); acceptance_rate = accepted / drafted tokens. Derived fields are real fields so
    `dataclasses.asdict` and JSON carry them."""

    num_new_tokens: int
    num_target_forwards: int
    num_draft_tokens: int
    num_accepted_tokens: int
    elapsed_s: float
    draft_s: float = 0.0
    verify_s: float = 0.0
    prefill_s: float = 0.0
    num_drafts: int = 0  # verify steps that verified a draft (at least one node)
    # [i]: steps whose draft token at position i (depth i + 1) was accepted; sums to num_accepted_tokens
    num_accepted_per_pos: tuple[int, ...] = ()
    tau: float = field(init=False)
    acceptance_rate: float = field(init=False)
    tokens_per_s: float = field(init=False)

    def __post_init__(self) -> None:
        set_ = object.__setattr__
        set_(self, "num_accepted_per_pos", tuple(self.num_accepted_per_pos))
        set_(self, "tau", self.num_new_tokens / self.num_target_forwards if self.num_target_forwards else 0.0)
        set_(self, "acceptance_rate", self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else 0.0)
        set_(self, "tokens_per_s", self.num_new_tokens / self.elapsed_s if self.elapsed_s > 0 else 0.0)

    def to_dict(self) -> dict:
        return asdict(self)


def tally_accepted(per_pos: list[int], num_accepted: int) -> None:
    """Add one step to a per-position count: the accepted path is a prefix of the draft, so
    positions 0 .. num_accepted - 1 were accepted."""
    per_pos.extend([0] * (num_accepted - len(per_pos)))
    for i in range(num_accepted):
        per_pos[i] += 1


@dataclass(frozen=True)
class GenerationOutput:
    """What `Engine.generate` returns: ids exclude the prompt; finish_reason is eos, stop or length."""

    token_ids: list[int]
    text: str
    stats: GenerationStats
    finish_reason: str
    prompt_token_ids: list[int] = field(default_factory=list)
