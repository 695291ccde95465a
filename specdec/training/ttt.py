"""The training-time test (EAGLE-3): unroll the head on its own outputs, as drafting at depth does.

Window of pairs p = 0..n-1, pair p = (feature at p, token x_{p+1}), label: the target's greedy token
after x_{p+1}. Step 0 reads the target's fused features. Step j >= 1 reads, at p, the head's own
step j-1 output at p - 1 (what drafting feeds back), and attends to what the drafting of that node
would see: step-0 keys of pairs <= p - j (the real context, up to the tree's root) and, for every
i in 1..j, the step-i key at p - (j - i) (its own chain of drafted ancestors, itself last). That is
the tree attention of specdec.drafters.eagle, one depth at a time over every position at once.
The loss is the cross-entropy of every step (weights decay with depth), so the head learns to stay
right on its own, imperfect, features: acceptance then holds deeper into the tree.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from specdec.drafters.eagle_layer import EagleHead


def ttt_mask(n: int, step: int) -> torch.Tensor:
    """bool [n, (step + 1) * n]: query p of `step` over keys [step-0 block, step-1 block, ..., its own block]."""
    p = torch.arange(n)
    blocks = [p[None, :] <= p[:, None] - step]  # the real context up to the root
    for i in range(1, step + 1):  # the drafted chain: step-i key at p - (step - i)
        blocks.append(p[None, :] == p[:, None] - (step - i))
    return torch.cat(blocks, dim=1)


def ttt_outputs(head: EagleHead, feats: torch.Tensor, embeds: torch.Tensor, num_steps: int) -> list[torch.Tensor]:
    """feats [B, n, F] fused target features; embeds [B, n, H] of x_{p+1} -> the head's output [B, n, H] per step."""
    n = feats.shape[1]
    positions = torch.arange(n)  # RoPE is relative: a window's offset in its sequence changes nothing
    past, inputs, outs = None, feats, []
    for step in range(num_steps):
        out, past = head(inputs, embeds, positions, past, None if step == 0 else ttt_mask(n, step))
        outs.append(out)
        inputs = torch.cat([torch.zeros_like(out[:, :1]), out[:, :-1]], dim=1)  # step j+1 at p: step j's out at p - 1
    return outs


def ttt_losses(head: EagleHead, feats: torch.Tensor, embeds: torch.Tensor, labels: torch.Tensor,
               valid: torch.Tensor, head_weight: torch.Tensor, num_steps: int, decay: float = 0.8
               ) -> tuple[torch.Tensor, list[float]]:
    """labels [B, n] reduced-vocabulary indices (-100 = none); valid [B, n]; head_weight [V', H].
    Returns (weighted mean cross-entropy over the steps, top-1 accuracy per step)."""
    total, weights, accuracy = feats.new_zeros(()), 0.0, []
    for step, out in enumerate(ttt_outputs(head, feats, embeds, num_steps)):
        keep = valid & (labels >= 0)
        keep[:, :step] = False  # no real root before position 0
        logits = head.lm_input(out[keep]) @ head_weight.T  # [num_keep, V']
        if len(logits):
            total = total + decay ** step * F.cross_entropy(logits, labels[keep])
            weights += decay ** step
        accuracy.append(float((logits.argmax(-1) == labels[keep]).float().mean()) if len(logits) else 0.0)
    return total / max(weights, 1e-9), accuracy
