"""specdec's attention kernel: sdpa's numbers, and each query row's result bitwise independent of the
other rows in the call and of keys its mask hides (a verify row equals a one-token decode step)."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels.build import load_kernel

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(KERNEL.module is None or not KERNEL.isa.startswith("avx512"),
                                reason="the attention kernel needs the extension on an AVX-512 CPU")
B, HEADS, KV_HEADS, ROWS, DIM, KEYS = 2, 9, 3, 7, 64, 300


def qkv(dtype, seed=0):
    gen = torch.Generator().manual_seed(seed)
    make = lambda *shape: torch.randn(*shape, generator=gen).to(dtype)  # noqa: E731
    return make(B, HEADS, ROWS, DIM), make(B, KV_HEADS, KEYS, DIM), make(B, KV_HEADS, KEYS, DIM)


def attend(q, k, v, mask=None):
    return KERNEL.module.attend(q, k, v, mask, DIM ** -0.5)


def causal_mask() -> torch.Tensor:
    """[B, 1, rows, keys] additive: the rows are the last ROWS keys, each sees itself and the past."""
    mask = torch.zeros(B, 1, ROWS, KEYS)
    mask[..., KEYS - ROWS:] = torch.full((ROWS, ROWS), torch.finfo(torch.float32).min).triu(1)
    return mask


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_matches_sdpa(dtype, tol):
    q, k, v = qkv(dtype)
    group = HEADS // KV_HEADS
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1),
        attn_mask=torch.ones(ROWS, KEYS, dtype=torch.bool).tril(KEYS - ROWS)).transpose(1, 2)
    got = attend(q, k, v)
    assert got.shape == (B, ROWS, HEADS, DIM) and got.dtype == dtype
    torch.testing.assert_close(got.float(), want, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_are_invariant_bitwise(dtype):
    q, k, v = qkv(dtype, seed=1)
    together = attend(q, k, v)
    assert torch.equal(together, attend(q, k, v, causal_mask()))  # an explicit mask hides the same keys
    for i in range(ROWS):  # alone, over exactly the keys it sees: what a one-token decode step computes
        seen = KEYS - ROWS + i + 1
        alone = attend(q[:, :, i:i + 1], k[:, :, :seen], v[:, :, :seen])
        assert torch.equal(together[:, i], alone[:, 0]), f"row {i}"
    strided = q.transpose(1, 2).contiguous().transpose(1, 2)  # the layout transformers hands over
    assert torch.equal(attend(strided, k, v), together)


def test_tree_mask_hides_siblings_exactly():
    """A row whose mask hides keys in the middle (a sibling branch) equals attention over the rest."""
    q, k, v = qkv(torch.float32, seed=2)
    mask = torch.zeros(B, 1, ROWS, KEYS)
    mask[..., 100:140] = float("-inf")
    keep = torch.cat([torch.arange(100), torch.arange(140, KEYS)])
    assert torch.equal(attend(q, k, v, mask), attend(q, k[:, :, keep], v[:, :, keep],
                                                     torch.zeros(B, 1, ROWS, len(keep))))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("dim, heads, kv_heads", [(64, 9, 3), (64, 8, 2), (128, 4, 2), (32, 8, 1), (16, 4, 2)])
def test_heads_of_a_group_equal_each_head_alone_bitwise(dtype, dim, heads, kv_heads):
    """The heads sharing keys are scored and weighted together (blocks of keys, interleaved chains); each
    head's result is bitwise what it gets alone, with a mask hiding keys (one hidden block of 16 too)."""
    gen = torch.Generator().manual_seed(3)
    q = torch.randn(1, heads, 3, dim, generator=gen).to(dtype)
    k, v = (torch.randn(1, kv_heads, 70, dim, generator=gen).to(dtype) for _ in range(2))
    mask = torch.where(torch.rand(1, 1, 3, 70, generator=gen) < 0.3, float("-inf"), 0.0)
    mask[..., 16:32] = float("-inf")
    for m in (None, mask):
        together = KERNEL.module.attend(q, k, v, m, dim ** -0.5)
        group = heads // kv_heads
        for h in range(heads):
            g = h // group
            alone = KERNEL.module.attend(q[:, h:h + 1], k[:, g:g + 1], v[:, g:g + 1], m, dim ** -0.5)
            assert torch.equal(together[:, :, h], alone[:, :, 0]), (h, m is None)
