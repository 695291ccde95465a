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


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """x [B, heads, n, d] rotated by positions [n] (Llama's rotate-half convention)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)  # [d/2]
    angles = positions.float()[:, None] * inv[None]  # [n, d/2]
    cos, sin = torch.cat([angles, angles], -1).cos().to(x.dtype), torch.cat([angles, angles], -1).sin().to(x.dtype)
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


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
        q = rope(self.q_proj(y).view(b, n, c.num_heads, c.head_dim).transpose(1, 2), positions, c.rope_theta)
        k = rope(self.k_proj(y).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2), positions, c.rope_theta)
        v = self.v_proj(y).view(b, n, c.num_kv_heads, c.head_dim).transpose(1, 2)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        group = c.num_heads // c.num_kv_heads
        kk, vv = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)  # [B, heads, L + n, d]
        if mask is None and past is not None and past[0].shape[2] > 0:
            num_past = past[0].shape[2]
            mask = torch.ones(n, num_past + n, dtype=torch.bool, device=q.device).tril(num_past)
        attn = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, is_causal=mask is None and n > 1)
        x = x + self.o_proj(attn.transpose(1, 2).reshape(b, n, c.num_heads * c.head_dim))
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
