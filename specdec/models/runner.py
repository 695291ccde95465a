"""Drives a Hugging Face causal LM one forward at a time over a KV cache (never `generate()`).

One call = one forward over a few new tokens: a prefill, a plain decode step, a draft step, or a
tree verify step (explicit 4D mask and position ids on the sdpa path). Returns logits and the last
hidden states (what Medusa / EAGLE heads read).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import DynamicCache

from specdec.core.sampling import greedy_ids
from specdec.core.tree import TreeLayout, attention_bias, position_ids
from specdec import parallel
from specdec.core.types import DEFAULT_KV_CACHE, DEFAULT_LINEAR_KERNEL, check_kv_cache, check_linear_kernel
from specdec.errors import InvalidArgument
from specdec.kernels.build import ROWS_AVX512, load_kernel
from specdec.models.prefix_cache import PrefixCache
from specdec.models.static_cache import DEFAULT_CAPACITY, StaticKVCache


DRAFT_VOCAB_FILE = "draft_vocab.json"  # beside a draft checkpoint: the token ids its LM head may propose
MAX_VERIFY_ROWS = 65  # a verify forward's rows: the root and up to 64 tree nodes (max_tree_nodes' default)


def load_vocab_ids(checkpoint_dir) -> torch.Tensor | None:
    """The reduced draft vocabulary a checkpoint was trained on ([V'] int64), or None (full vocabulary)."""
    import json
    from pathlib import Path

    path = Path(checkpoint_dir) / DRAFT_VOCAB_FILE
    return torch.tensor(json.loads(path.read_text()), dtype=torch.long) if path.is_file() else None


@dataclass(frozen=True)
class RunnerConfig:
    """How a model's forwards run (the same for a target and its draft model)."""

    kv_cache: str = DEFAULT_KV_CACHE  # static | dynamic
    # Verify forwards as CUDA graphs for padded shapes (specdec.graphs). None (auto): wherever they run
    # (one CUDA device, a static cache), eager elsewhere without a word; True: asked for, so eager where
    # they cannot run is logged once with the reason; False: eager. Off unless asked: a target's
    # deployments (Engine.from_pretrained, the target worker) ask for auto; draft models and heads never do.
    cuda_graphs: bool | None = False
    # auto | specdec | torch: the linear layers and LM head on specdec's row-invariant CPU kernel
    # (specdec.kernels.linear) or on torch's F.linear; auto = specdec's wherever it runs.
    linear_kernel: str = DEFAULT_LINEAR_KERNEL
    # With specdec's kernels, walk a Llama-family decoder in one C++ call (specdec.kernels.lean) rather
    # than through transformers' modules; False keeps transformers' walk (same bits, slower).
    lean_forward: bool = True
    # On the lean walk, a batch's verify forward computes each sequence's own rows (forward_rows) rather
    # than the batch padded to its largest tree; False pads (same bits; for comparing the two).
    ragged: bool = True
    # Keys and values of prompt openings kept across requests, up to this many MiB (specdec.models.prefix_cache);
    # 0 = off. A target's sequences use it (Engine, target worker); a draft model's runner leaves it off.
    prefix_cache_mb: int = 0

    def __post_init__(self) -> None:
        check_kv_cache(self.kv_cache)
        check_linear_kernel(self.linear_kernel)
        if not isinstance(self.prefix_cache_mb, int) or self.prefix_cache_mb < 0:
            raise InvalidArgument(f"prefix_cache_mb must be an integer >= 0, got {self.prefix_cache_mb!r}")


class ModelRunner:
    def __init__(self, model: torch.nn.Module, vocab_ids: torch.Tensor | None = None,
                 config: RunnerConfig = RunnerConfig()):
        """vocab_ids: [V'] token ids the head computes (FR-Spec, for draft models: the rows of the largest
        matmul of a small model shrink to V'); the other tokens get logit -inf, so they are never
        drafted and q is exactly what the drafter samples from. None = the full vocabulary.
        config.kv_cache: "static" (preallocated, committed by index bookkeeping:
        specdec.models.static_cache) or "dynamic" (transformers' DynamicCache, grown by concatenation)."""
        from specdec.kernels import arena, attention, lean
        from specdec.models import rotary
        from specdec.kernels.linear import PackedLinear, install

        self.model = model
        self.run_config = config
        self.linear_kernel = install(model, config.linear_kernel)  # before anything reads the layers
        # specdec's kernels run the attention too (row-invariant as the linear layers), where they can
        self.attention_kernel = attention.install(model, self.linear_kernel.kernel == "specdec")
        self.max_rows = MAX_VERIFY_ROWS  # the most rows one forward appends, as caches are sized for
        self.invariant_rows = attention.MAX_ROWS  # the most rows of one causal forward on specdec's attention
        self.config = model.config
        self.vocab_size = model.config.vocab_size
        first = next(model.parameters())
        self.dtype = first.dtype
        self.device = first.device  # every tensor a forward gets is made here (specdec.device)
        self.decoder = getattr(model, model.base_model_prefix)
        rotary.install(self.decoder)  # cos/sin per position computed once: the same bits in every forward
        # prompt openings' keys and values across requests: a static cache on one process (tensor-parallel
        # ranks would each need the same blocks at the same moments)
        self.prefix_cache = (PrefixCache(config.prefix_cache_mb << 20) if config.prefix_cache_mb > 0
                             and config.kv_cache == "static" and parallel.world_size() == 1 else None)
        head = model.get_output_embeddings()
        plain_head = (isinstance(head, torch.nn.Linear) and head.bias is None
                      and not hasattr(head.weight, "device_mesh")  # a tensor-parallel (DTensor) head gathers itself
                      and not any(getattr(model.config, n, None) for n in ("final_logit_softcapping", "logit_scale")))
        self.head = head
        self.head_weight = head.weight if plain_head else None  # [vocab, hidden], or [V', hidden] with vocab_ids
        self.vocab_ids = vocab_ids.to(self.device) if plain_head and vocab_ids is not None else None
        if self.vocab_ids is not None:
            self.head_weight = head.weight.detach()[self.vocab_ids].contiguous()
        self.feature_layers: tuple[int, ...] = ()  # hidden_states indices kept for a fused-feature head
        self.captured: dict[int, torch.Tensor] = {}  # the last forward's output of each such layer
        self.packed_head = None  # the head's weight packed for rowgemm: logits straight in float32
        if self.head_weight is not None and self.linear_kernel.kernel == "specdec":
            self.packed_head = PackedLinear(self.head_weight, None)
        if self.linear_kernel.kernel == "specdec":  # every packed weight in one buffer, in the order a forward reads
            arena.place_packed([m for m in model.modules() if isinstance(m, PackedLinear)]  # q, k, v, o, gate, up, ...
                               + ([self.packed_head] if self.packed_head is not None else []))
        self.lean = lean.build(model, self.decoder, self.linear_kernel, self.attention_kernel, config.lean_forward)
        # greedy picks on the calling thread in AVX-512 (specdec/kernels/argmax.cpp), where specdec's kernels run
        self.argmax_kernel = load_kernel().rows_avx512 if self.linear_kernel.kernel == "specdec" else None
        self.graphs = None
        from specdec.graphs import GraphedDecoder, why_not

        if config.cuda_graphs or (config.cuda_graphs is None and why_not(self) is None):
            self.graphs = GraphedDecoder(self)

    def capture_layers(self, layers: tuple[int, ...]) -> None:
        """Keep the hidden states after these layers (hidden_states indices: k = after k decoder layers) from
        every forward, for a head that reads them fused (EAGLE-3). Hooks only keep references: no extra
        pass, no copy; `features` concatenates them when a sequence asks."""
        layers = tuple(layers)
        if layers == self.feature_layers:
            return
        if self.feature_layers:
            raise ValueError(f"this runner already captures layers {self.feature_layers}, not {layers}")
        self.feature_layers = layers
        for k in layers:
            self.decoder.layers[k - 1].register_forward_hook(lambda _m, _a, out, k=k: self._keep(k, out))

    def _keep(self, k: int, output) -> None:
        self.captured[k] = output[0] if isinstance(output, tuple) else output

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """What a feature-reading head keeps for the last forward's rows: `hidden` ([n, H] or [B, N, H]) itself,
        or with captured layers their states fused, [n, F] or [B, N, F] (F = len(layers) * H)."""
        if not self.feature_layers:
            return hidden
        fused = torch.cat([self.captured[k] for k in self.feature_layers], dim=-1)  # [B, N, F] or packed [n, F]
        return fused[0] if hidden.dim() == 2 and fused.dim() == 3 else fused

    def new_cache(self, capacity: int | None = None) -> DynamicCache | StaticKVCache:
        """An empty cache. capacity: the most entries it will hold (a static cache preallocates that
        many and grows by doubling past it; None = unknown, start small); a dynamic cache ignores it."""
        if self.run_config.kv_cache == "dynamic":
            return DynamicCache(config=self.config)
        return StaticKVCache(self.config.num_hidden_layers, capacity or DEFAULT_CAPACITY)

    @torch.inference_mode()
    def forward(self, input_ids: list[int], cache: DynamicCache, layout: TreeLayout | None = None,
                attn_bias: torch.Tensor | None = None, positions: torch.Tensor | None = None,
                want_logits: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
        """Append len(input_ids) entries to cache; return (logits [n, vocab] float32 | None, hidden [n, hidden]).

        layout: a draft tree's layout for input = [root] + nodes at the cache's end (None or a chain:
        plain causal attention). attn_bias / positions: an explicit mask [1, 1, n, cached + n] and
        position ids [1, n] for callers that lay out trees themselves (the draft model).
        """
        ids = torch.tensor([input_ids], dtype=torch.long, device=self.device)
        if layout is not None and not layout.is_chain:
            num_cached = cache.get_seq_length()
            attn_bias = attention_bias(layout, num_cached, self.dtype, self.device)
            positions = position_ids(layout, num_cached, self.device)
        if attn_bias is None and positions is None and self.attention_kernel and ids.shape[1] > self.invariant_rows:
            hidden = self._causal_in_chunks(ids, cache)[0]
        else:
            hidden = self.eager_forward_batch(ids, cache, attn_bias, positions)[0]  # [n, hidden]
        if not want_logits:
            return None, hidden
        return self.logits(hidden), hidden

    def _causal_in_chunks(self, ids: torch.Tensor, cache) -> torch.Tensor:
        """ids [1, n] -> hidden [1, n, H]: a causal forward longer than specdec's attention takes (a long
        prompt), as consecutive forwards of at most invariant_rows rows. Longer calls would run sdpa, whose
        rows depend on the call's shape, so a prompt's keys and values would depend on how it was cut into
        prefill chunks, and on how much of it the prefix cache restored: plain decoding of one prompt could
        differ from itself, and a speculative run from a plain one. In chunks the kernel takes, each row is
        bitwise what it is in any other cut."""
        hidden, captured = [], {k: [] for k in self.feature_layers}
        for start in range(0, ids.shape[1], self.invariant_rows):
            hidden.append(self.eager_forward_batch(ids[:, start:start + self.invariant_rows], cache, None, None))
            for k in self.feature_layers:
                captured[k].append(self.captured[k])
        self.captured.update({k: torch.cat(parts, dim=-2) for k, parts in captured.items()})
        return torch.cat(hidden, dim=1)

    @torch.inference_mode()
    def forward_batch(self, input_ids: torch.Tensor, cache: DynamicCache, attn_bias: torch.Tensor,
                      positions: torch.Tensor) -> torch.Tensor:
        """Padded batch: input_ids [B, N], attn_bias [B, 1, N, cached + N], positions [B, N] -> hidden [B, N, H]."""
        if self.graphs is not None and self.graphs.active and not self.feature_layers:  # replays skip the hooks
            return self.graphs.forward_batch(input_ids, cache, attn_bias, positions)
        return self.eager_forward_batch(input_ids, cache, attn_bias, positions)

    @torch.inference_mode()
    def forward_rows(self, input_ids: torch.Tensor, cache: DynamicCache, attn_bias: torch.Tensor | None,
                     positions: torch.Tensor, seq_rows: list[int]) -> torch.Tensor:
        """A padded batch whose sequence b has only its first seq_rows[b] rows: input_ids [B, N], attn_bias
        [B, 1, N, cached + N], positions [B, N] -> hidden [sum seq_rows, H], the sequences' rows packed (and
        captured layers the same way). The lean walk computes no padding rows (ragged), so a verify step
        costs its real rows; any other walk runs the padded forward and drops them."""
        batch, n = input_ids.shape
        if (self.ragged and batch > 1 and attn_bias is not None and min(seq_rows) < n
                and self.lean.runs(cache, n)):
            hidden, captured = self.lean(input_ids, cache, attn_bias, positions, self.feature_layers, seq_rows)
            self.captured.update(captured)
            return hidden
        hidden = self.forward_batch(input_ids, cache, attn_bias, positions)
        if batch == 1:
            return hidden[0, :seq_rows[0]]
        for k in self.feature_layers:
            self.captured[k] = torch.cat([self.captured[k][b, :rows] for b, rows in enumerate(seq_rows)])
        return torch.cat([hidden[b, :rows] for b, rows in enumerate(seq_rows)])

    @property
    def ragged(self) -> bool:
        """Whether a batch's verify forward computes each sequence's own rows only (forward_rows on the
        lean walk), so its cost follows the sum of the trees' sizes rather than the batch times the largest."""
        return (self.run_config.ragged and self.lean is not None and self.run_config.kv_cache == "static"
                and not (self.graphs is not None and self.graphs.active))

    def eager_forward_batch(self, input_ids: torch.Tensor, cache: DynamicCache, attn_bias: torch.Tensor | None,
                            positions: torch.Tensor | None) -> torch.Tensor:
        """input_ids [B, N] -> hidden [B, N, H]: the lean C++ walk where it runs, else transformers' modules."""
        if self.lean is not None and self.lean.runs(cache, input_ids.shape[1]):
            hidden, captured = self.lean(input_ids, cache, attn_bias, positions, self.feature_layers)
            self.captured.update(captured)
            return hidden
        return self.decoder(input_ids=input_ids, attention_mask=attn_bias, position_ids=positions,
                            past_key_values=cache, use_cache=True).last_hidden_state

    @property
    def num_team_probes(self) -> int:
        """Forwards so far run the slower way on purpose (specdec.kernels.team): a step that ran one
        took longer than a step of its size costs, so the speculation policy does not learn from it."""
        return self.lean.team.num_probes if self.lean is not None else 0

    def greedy_ids(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [rows, vocab] -> the greedy token per row [rows], torch's max(dim=-1).indices bit for bit.
        Every greedy pick of the target goes through here, so plain and speculative decoding pick alike."""
        if self.argmax_kernel is not None and logits.dim() == 2 and logits.dtype == torch.float32 \
                and logits.device.type == "cpu" and logits.shape[1] > 0:
            return self.argmax_kernel.argmax_rows(logits, ROWS_AVX512)
        return greedy_ids(logits)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [n, hidden] -> logits [n, vocab] float32.

        For n > 1 `W @ h.T` runs 2-3x faster than `F.linear` in MKL on CPU (measured: 7 vs 19 ms for
        2 rows of SmolLM2's 49152-row head), and the head is the largest matmul of a small model.
        On a GPU cuBLAS has no such gap: F.linear.
        """
        if self.head_weight is None:
            return self.head(hidden).float()
        if self.packed_head is not None:
            logits = self.packed_head(hidden, out_fp32=True)
        elif hidden.shape[0] == 1 or self.device.type != "cpu":
            logits = torch.nn.functional.linear(hidden, self.head_weight).float()
        else:
            logits = (self.head_weight @ hidden.T).T.float()
        if self.vocab_ids is None:
            return logits
        full = torch.full((hidden.shape[0], self.vocab_size), float("-inf"), device=hidden.device)
        full[:, self.vocab_ids] = logits
        return full
