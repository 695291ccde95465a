"""The EAGLE-style head's network: fc(feature, next-token embedding) -> one Llama decoder layer -> feature.

Written out (RMSNorm, grouped-query attention with RoPE, SiLU MLP) rather than borrowed from
transformers because the drafter drives its own tiny KV cache with tree masks, and training runs the
same code over whole windows: one forward signature for both, plain tensors for the cache.
Input at position t is (f_t, embed(x_{t+1})); the output predicts f_{t+1}, the target's feature,
which the target's own LM head turns into the distribution of x_{t+2}.

With feature_layers (EAGLE-3), f_t is the target's hidden states after a low, a middle and a high layer,
concatenated and projected to the hidden size by `fuse`; the output is no longer asked to equal a
target feature: it goes through the head's own final norm into the (reduced) LM head, and at depth > 1
it is fed back as the next input feature, as the training-time test trains it to be.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class EagleConfig:
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    rope_theta: float
    rms_eps: float
    target_vocab_size: int
    top_k: int = 8  # children per expanded node, and nodes expanded per depth
    depth: int = 6  # tree depth
    num_nodes: int = 24  # the rerank budget: nodes sent to verification
    min_path_prob: float = 0.4  # drafting stops once no new node's path is this likely (0: always full depth)
    feature_layers: tuple[int, ...] = ()  # EAGLE-3: hidden_states indices fused as input; () = the last feature

    @property
    def num_fused(self) -> int:
        return max(len(self.feature_layers), 1)

    @staticmethod
    def for_target(config, **kw) -> EagleConfig:
        """The decoder layer mirrors one layer of the target (`config`: its transformers config)."""
        rope = getattr(config, "rope_parameters", None) or {}
        theta = rope.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        heads = config.num_attention_heads
        return EagleConfig(config.hidden_size, heads, getattr(config, "num_key_value_heads", heads),
                           getattr(config, "head_dim", None) or config.hidden_size // heads,
                           config.intermediate_size, float(theta), float(config.rms_norm_eps), config.vocab_size, **kw)

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=1))

    @staticmethod
    def load(path: Path) -> EagleConfig:
        fields = json.loads(path.read_text())
        fields["feature_layers"] = tuple(fields.get("feature_layers", ()))
        return EagleConfig(**fields)


class RMSNorm(torch.nn.Module):
    def __init__(self, size: int, eps: float):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope_tables(positions: torch.Tensor, head_dim: int, theta: float, dtype: torch.dtype
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(cos, sin) [n, d] for positions [n] (Llama's rotate-half convention), angles in float32; built
    once per forward and applied to both queries and keys."""
    inv = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32, device=positions.device) / head_dim)
    angles = positions.float()[:, None] * inv[None]  # [n, d/2]
    angles = torch.cat([angles, angles], -1)  # [n, d]
    return angles.cos().to(dtype), angles.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [B, heads, n, d] rotated by the tables of rope_tables."""
    d = x.shape[-1]
    return x * cos + torch.cat([-x[..., d // 2:], x[..., : d // 2]], -1) * sin


def sdpa_attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None) -> torch.Tensor:
    """q [B, heads, n, d], k / v [B, kv_heads, L, d], mask bool [n, L] (True = attend) or None (causal,
    n == L) -> [B, n, heads, d]. torch's attention: differentiable, for training and any device."""
    group = q.shape[1] // k.shape[1]
    kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, heads, L, d]
    out = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=mask is None and q.shape[2] > 1)
    return out.transpose(1, 2)


class EagleHead(torch.nn.Module):
    def __init__(self, c: EagleConfig):
        super().__init__()
        self.c = c
        h = c.hidden_size
        self.fc = torch.nn.Linear(2 * h, h)
        self.input_norm = RMSNorm(h, c.rms_eps)
        self.q_proj = torch.nn.Linear(h, c.num_heads * c.head_dim, bias=False)
        self.k_proj = torch.nn.Linear(h, c.num_kv_heads * c.head_dim, bias=False)
        self.v_proj = torch.nn.Linear(h, c.num_kv_heads * c.head_dim, bias=False)
        self.o_proj = torch.nn.Linear(c.num_heads * c.head_dim, h, bias=False)
        self.post_norm = RMSNorm(h, c.rms_eps)
        self.gate_proj = torch.nn.Linear(h, c.intermediate_size, bias=False)
        self.up_proj = torch.nn.Linear(h, c.intermediate_size, bias=False)
        self.down_proj = torch.nn.Linear(c.intermediate_size, h, bias=False)
        if c.feature_layers:  # EAGLE-3: fused layers in, the head's own final norm before the LM head
            self.fuse = torch.nn.Linear(c.num_fused * h, h, bias=False)
            self.norm = RMSNorm(h, c.rms_eps)
        self.attend = sdpa_attend  # the drafter may point it at specdec's attention kernel (same contract)

    def lm_input(self, out: torch.Tensor) -> torch.Tensor:
        """out [..., H] (the layer's output) -> what the LM head reads."""
        return self.norm(out) if self.c.feature_layers else out

    def forward(self, feats: torch.Tensor, embeds: torch.Tensor, positions: torch.Tensor,
                past: tuple[torch.Tensor, torch.Tensor] | None = None, mask: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """feats [B, n, H] or fused target features [B, n, num_fused * H]; embeds [B, n, H]; positions [n];
        past (k, v) [B, kv_heads, L, d]; mask bool [n, L + n] (None = causal).
        Returns (outputs [B, n, H], (k, v) [B, kv_heads, L + n, d])."""
        c = self.c
        b, n, _ = feats.shape
        if feats.shape[-1] != c.hidden_size:
            feats = self.fuse(feats)
        x = self.fc(torch.cat([feats, embeds], dim=-1))  # [B, n, H]
        y = self.input_norm(x)
        cos, sin = rope_tables(positions, c.head_dim, c.rope_theta, y.dtype)
        q = apply_rope(self.q_proj(y).view(b, n, c.num_heads, c.head_dim).transpose(1, 2), cos, sin)
        k = apply_rope(self.k_proj(y).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2), cos, sin)
        v = self.v_proj(y).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        if mask is None and past is not None and past[0].shape[2] > 0:
            num_past = past[0].shape[2]
            mask = torch.ones(n, num_past + n, dtype=torch.bool, device=q.device).tril(num_past)
        attn = self.attend(q, k, v, mask)  # [B, n, heads, d]
        x = x + self.o_proj(attn.reshape(b, n, c.num_heads * c.head_dim))
        y = self.post_norm(x)
        x = x + self.down_proj(F.silu(self.gate_proj(y)) * self.up_proj(y))
        return x, (k, v)


def save_eagle(out: Path, head: EagleHead, vocab_ids: torch.Tensor) -> None:
    from safetensors.torch import save_file

    out.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().to(torch.bfloat16).contiguous() for k, v in head.state_dict().items()}
    tensors["vocab_ids"] = vocab_ids.to(torch.int32)
    save_file(tensors, str(out / "eagle.safetensors"))
    head.c.save(out / "eagle_config.json")


def load_eagle(path: Path, dtype: torch.dtype) -> tuple[EagleHead, torch.Tensor]:
    from safetensors.torch import load_file

    from specdec.errors import ModelNotFound

    path = Path(path)
    if not (path / "eagle.safetensors").is_file() or not (path / "eagle_config.json").is_file():
        raise ModelNotFound(f"{str(path)!r} holds no EAGLE head (eagle.safetensors + eagle_config.json)")
    tensors = load_file(str(path / "eagle.safetensors"))
    vocab_ids = tensors.pop("vocab_ids").long()
    head = EagleHead(EagleConfig.load(path / "eagle_config.json"))
    head.load_state_dict({k: v.to(dtype) for k, v in tensors.items()})
    return head.to(dtype).eval().requires_grad_(False), vocab_ids
