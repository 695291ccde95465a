"""Weights laid out once for rowgemm.cpp: tiles of 32 output features, k-major inside a tile.

    float32   W [N, K] -> [ceil(N/32), K, 32]         (outputs zero-padded to whole tiles)
    bfloat16  W [N, K] -> [ceil(N/32), ceil(K/2), 32, 2]  (k padded to even; pairs of k per output)

A tile is the kernel's unit of streaming: its rows of k sit one after another, so it reads as one
sequential stream, and its 32 outputs fill two 16-lane vectors.
"""
from __future__ import annotations

import torch

TILE = 32


def num_tiles(num_outputs: int) -> int:
    return -(-num_outputs // TILE)


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight [N, K] float32 | bfloat16 -> the packed layout above (a new contiguous tensor)."""
    n, k = weight.shape
    tiles = num_tiles(n)
    padded = torch.nn.functional.pad(weight.detach(), (0, k % 2 if weight.dtype == torch.bfloat16 else 0,
                                                       0, tiles * TILE - n))
    if weight.dtype == torch.bfloat16:
        return padded.view(tiles, TILE, padded.shape[1] // 2, 2).permute(0, 2, 1, 3).contiguous()
    if weight.dtype != torch.float32:
        raise TypeError(f"rowgemm packs float32 or bfloat16 weights, not {weight.dtype}")
    return padded.view(tiles, TILE, k).transpose(1, 2).contiguous()


def unpack(packed: torch.Tensor, num_outputs: int, num_inputs: int) -> torch.Tensor:
    """The inverse of pack: [N, K] (for code that reads a layer's .weight)."""
    if packed.dim() == 4:
        tiles = packed.shape[0]
        flat = packed.permute(0, 2, 1, 3).reshape(tiles * TILE, -1)
    else:
        flat = packed.transpose(1, 2).reshape(-1, packed.shape[1])
    return flat[:num_outputs, :num_inputs].contiguous()
