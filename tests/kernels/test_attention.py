"""specdec's attention kernel: sdpa's numbers, and each query row's result bitwise independent of the
other rows in the call and of keys its mask hides (a verify row equals a one-token decode step)."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels.build import load_kernel

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(KERNEL.module is None or KERNEL.isa == "scalar",
                                reason="the attention kernel needs the extension on an AVX2 or AVX-512 CPU")
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


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-5), (torch.bfloat16, 2e-2)])
def test_additive_mask_from_any_key_matches_sdpa(dtype, tol):
    """The kernel skips adding a row's mask over its leading zeros: a finite bias that starts anywhere
    (at key 0, mid-block, at the last key, nowhere), contiguous or strided, still counts where it is."""
    q, k, v = qkv(dtype, seed=5)
    gen = torch.Generator().manual_seed(6)
    mask = torch.zeros(B, 1, ROWS, KEYS)
    for i, start in enumerate((0, 5, 17, 150, KEYS - 1, KEYS, 64)):
        mask[:, :, i, start:] = -3.0 * torch.rand(B, 1, KEYS - start, generator=gen)
    group = HEADS // KV_HEADS
    want = torch.nn.functional.scaled_dot_product_attention(
        q.float(), k.float().repeat_interleave(group, 1), v.float().repeat_interleave(group, 1),
        attn_mask=mask).transpose(1, 2)
    strided = mask.transpose(-1, -2).contiguous().transpose(-1, -2)  # keys ROWS floats apart
    for m in (mask, strided):
        torch.testing.assert_close(attend(q, k, v, m).float(), want, rtol=tol, atol=tol)


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


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_mask_hides_siblings_exactly(dtype):
    """A row whose mask hides keys in the middle (a sibling branch) equals attention over the rest."""
    q, k, v = qkv(dtype, seed=2)
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


def attend_rows(q, k, v, mask=None):
    return KERNEL.module.attend(q, k, v, mask, q.shape[-1] ** -0.5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("heads, kv_heads", [(9, 3), (8, 1), (4, 4)])
def test_tiled_rows_equal_one_row_calls_at_long_caches(dtype, heads, kv_heads):
    """Many rows are tiled (blocks of rows x heads of a kv group per work unit, blocks sized by the row
    count and the thread count); each row's result is bitwise its one-row call's, for 1, 3, 8 or 17 rows,
    1 or 2 threads, either sequence of a batch, with a tree's mask over the last keys or causal."""
    gen = torch.Generator().manual_seed(4)
    keys, rows = 1100, 17
    q = torch.randn(2, heads, rows, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(2, kv_heads, keys, DIM, generator=gen).to(dtype) for _ in range(2))
    mask = torch.zeros(2, 1, rows, keys)
    mask[..., -40:] = torch.where(torch.rand(2, 1, rows, 40, generator=gen) < 0.5, float("-inf"), 0.0)
    alone = [[attend_rows(q[b:b + 1, :, i:i + 1], k[b:b + 1], v[b:b + 1], mask[b:b + 1, :, i:i + 1])[0, 0]
              for i in range(rows)] for b in range(2)]
    threads = torch.get_num_threads()
    try:
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            for n in (1, 3, 8, 17):
                masked, causal = attend_rows(q[:, :, :n], k, v, mask[:, :, :n]), attend_rows(q[:, :, -n:], k, v)
                for b in range(2):
                    for i in range(n):
                        assert torch.equal(masked[b, i], alone[b][i]), (num_threads, n, b, i)
                        seen = keys - n + i + 1  # causal: row i of the last n sees the keys up to itself
                        one = attend_rows(q[b:b + 1, :, rows - n + i:rows - n + i + 1], k[b:b + 1, :, :seen],
                                          v[b:b + 1, :, :seen])
                        assert torch.equal(causal[b, i], one[0, 0]), (num_threads, n, b, i, "causal")
    finally:
        torch.set_num_threads(threads)


def assert_rows_equal_their_kept_keys_alone(q, k, v, mask):
    """Each row of one call under `mask` ([1, 1, rows, keys], 0 = kept) is bitwise its one-row call over
    exactly the keys its mask keeps, packed contiguously (as plain decoding's cache holds a tree row's path)."""
    together = attend_rows(q, k, v, mask)
    for i in range(q.shape[2]):
        seen = (mask[0, 0, i] == 0).nonzero()[:, 0]
        alone = attend_rows(q[:, :, i:i + 1], k[:, :, seen], v[:, :, seen])
        assert torch.equal(together[0, i], alone[0, 0]), i


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_tree_rows_at_a_long_cache_equal_their_contiguous_path(dtype):
    """17 tree rows over 1,100 cached keys (siblings hidden between a row's ancestors) against each row's
    ancestors packed contiguously after the cache, as plain decoding's cache holds them."""
    gen = torch.Generator().manual_seed(5)
    cached, rows = 1100, 17
    q = torch.randn(1, 9, rows, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(1, 3, cached + rows, DIM, generator=gen).to(dtype) for _ in range(2))
    parents = [-1] + [int(torch.randint(0, i, (1,), generator=gen)) for i in range(1, rows)]
    mask = torch.full((1, 1, rows, cached + rows), float("-inf"))
    mask[..., :cached] = 0.0
    for i in range(rows):
        node = i
        while node >= 0:
            mask[0, 0, i, cached + node] = 0.0
            node = parents[node]
    assert_rows_equal_their_kept_keys_alone(q, k, v, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_with_vanishing_probabilities_equal_one_row_calls(dtype):
    """Sharp rows (large queries: many keys' exp falls below e^-87 and is exactly 0) with a hidden run of
    keys in the middle: each row of a 16-row call is bitwise its one-row call over exactly the keys its
    mask leaves. (AMX weighs the values by each pair's own ordinals of nonzero probabilities, so a zero
    that moves which keys share a block of 32 must not change the row's bits.)"""
    gen = torch.Generator().manual_seed(6)
    keys, rows = 700, 16
    q = (torch.randn(1, 9, rows, DIM, generator=gen) * torch.linspace(0.5, 60.0, rows).view(1, 1, rows, 1)).to(dtype)
    k, v = (torch.randn(1, 3, keys, DIM, generator=gen).to(dtype) for _ in range(2))
    mask = torch.zeros(1, 1, rows, keys)
    for i in range(rows):
        mask[..., i, 37 + 5 * i:90 + 7 * i] = float("-inf")  # a hidden run that shifts the later keys
    assert_rows_equal_their_kept_keys_alone(q, k, v, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rows_hiding_keys_at_different_places_equal_one_row_calls(dtype):
    """Rows hide keys at their own places, so after the first block of 64 keys some rows have a key waiting
    for its partner (key 63, or 62 where 63 is hidden) and some none, and a later block is not fully
    weighed by every row (bf16 dot-pairs pair a row's keys by ordinal; a run that a row group shares must
    take each row's own waiting key first): each row equals its one-row call over exactly its kept keys."""
    gen = torch.Generator().manual_seed(11)
    keys, rows = 300, 16
    q = torch.randn(1, 9, rows, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(1, 3, keys, DIM, generator=gen).to(dtype) for _ in range(2))
    mask = torch.zeros(1, 1, rows, keys)
    for i in range(rows):
        mask[..., i, 60 + i % 4] = float("-inf")  # 63 keys in the first block: key 63 waits, or 62 where 63 is hidden
        mask[..., i, 3 * i] = float("-inf") if i >= 8 else 0.0  # two hidden: no key waits
        if i % 4 >= 2:
            mask[..., i, 130 + i] = float("-inf")  # a later block a row group does not share
    assert_rows_equal_their_kept_keys_alone(q, k, v, mask)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_every_key_count_equals_a_longer_cache_masked(dtype):
    """Keys are scored up to 64 at a time (AMX: four blocks of 16 on tiles at once, a last partial block
    zero-padded): a call over m keys equals, bitwise, the call over 80 keys with the keys from m hidden."""
    gen = torch.Generator().manual_seed(7)
    q = torch.randn(1, 9, 2, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(1, 3, 80, DIM, generator=gen).to(dtype) for _ in range(2))
    for m in range(1, 81):
        mask = torch.zeros(1, 1, 2, 80)
        mask[..., m:] = float("-inf")
        assert torch.equal(attend_rows(q, k[:, :, :m], v[:, :, :m], torch.zeros(1, 1, 2, m)), attend_rows(q, k, v, mask)), m


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_units_of_a_kv_group_reusing_its_values_equal_one_row_calls(dtype):
    """A kv group's rows over several units on one thread (AMX: the values re-laid into key pairs by one
    unit serve the group's next units of the call): rows whose shared blocks end early (a hidden run in the
    first and the last rows), mid-way or late (a causal ramp over 40 rows) equal their one-row calls."""
    gen = torch.Generator().manual_seed(8)
    keys, rows = 130, 40
    q = torch.randn(1, 9, rows, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(1, 3, keys, DIM, generator=gen).to(dtype) for _ in range(2))
    mask = torch.zeros(1, 1, rows, keys)
    for i in range(rows):
        mask[0, 0, i, keys - rows + i + 1:] = float("-inf")
    mask[0, 0, :5, 20:50] = float("-inf")
    mask[0, 0, -5:, 40:60] = float("-inf")
    alone = [attend_rows(q[:, :, i:i + 1], k, v, mask[:, :, i:i + 1])[0, 0] for i in range(rows)]
    threads = torch.get_num_threads()
    try:
        for num_threads in (1, 2):
            torch.set_num_threads(num_threads)
            together = attend_rows(q, k, v, mask)
            for i in range(rows):
                assert torch.equal(together[0, i], alone[i]), (num_threads, i)
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_a_call_rereads_values_changed_in_place(dtype):
    """Each thread keeps its scratch (and AMX's values re-laid into key pairs) from call to call: a cache
    rewritten in place between two calls of one shape (a rollback, then other tokens) is read afresh."""
    gen = torch.Generator().manual_seed(9)
    q = torch.randn(1, 9, 8, DIM, generator=gen).to(dtype)
    k, v = (torch.randn(1, 3, 300, DIM, generator=gen).to(dtype) for _ in range(2))
    before = attend_rows(q, k, v)
    v[:, :, 100:200] = torch.randn(1, 3, 100, DIM, generator=gen).to(dtype)
    after = attend_rows(q, k, v)
    assert not torch.equal(before, after)
    assert torch.equal(after, attend_rows(q, k.clone(), v.clone()))
