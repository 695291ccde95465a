"""specdec's rowgemm kernel: numerics against torch, and row invariance bit for bit (what keeps a
verify forward and a one-token decode step in exact agreement)."""
from __future__ import annotations

import pytest
import torch

from specdec.kernels.build import ISA_NAMES, load_kernel
from specdec.kernels.packing import pack, unpack

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(KERNEL.module is None, reason=f"rowgemm unavailable: {KERNEL.reason}")
BEST = ISA_NAMES.index(KERNEL.isa) if KERNEL.module is not None else -1
F32_ISAS = [i for i in (0, 1, 2) if i <= BEST]  # scalar, avx2, avx512: every path this CPU runs
SHAPES = [(576, 576), (100, 77), (33, 1536), (5, 3)]  # N, K: SmolLM2's, and ragged tails of tiles and k


def rowgemm(x: torch.Tensor, packed: torch.Tensor, n: int, isa: int = -1, out_fp32: bool = False) -> torch.Tensor:
    return KERNEL.module.rowgemm(x.contiguous(), packed, n, isa, out_fp32)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("n, k", SHAPES)
def test_pack_unpack_round_trip(dtype, n, k):
    weight = torch.randn(n, k).to(dtype)
    assert torch.equal(unpack(pack(weight), n, k), weight)


@pytest.mark.parametrize("isa", F32_ISAS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_float32_matches_torch(isa, n, k):
    gen = torch.Generator().manual_seed(n * k)
    weight, x = torch.randn(n, k, generator=gen), torch.randn(13, k, generator=gen)
    got = rowgemm(x, pack(weight), n, isa)
    assert got.shape == (13, n) and got.dtype == torch.float32
    torch.testing.assert_close(got, x @ weight.T, rtol=1e-5, atol=1e-4)


BF16_ISAS = [i for i in (1, 3, 4) if i <= BEST]  # AVX2 (widened to float32), AVX512-BF16, AMX tiles


@pytest.mark.skipif(not KERNEL.runs_bf16, reason="this CPU runs no bfloat16 path (AVX2 at least)")
@pytest.mark.parametrize("isa", BF16_ISAS)
@pytest.mark.parametrize("n, k", SHAPES)
def test_bfloat16_matches_float32_products_of_bf16_values(isa, n, k):
    gen = torch.Generator().manual_seed(n + k)
    weight, x = torch.randn(n, k, generator=gen).bfloat16(), torch.randn(9, k, generator=gen).bfloat16()
    exact = x.double() @ weight.double().T  # the bf16 values multiplied exactly
    got32 = rowgemm(x, pack(weight), n, isa, out_fp32=True)
    assert got32.dtype == torch.float32
    torch.testing.assert_close(got32.double(), exact, rtol=1e-4, atol=1e-3 * k ** 0.5)
    got16 = rowgemm(x, pack(weight), n, isa)
    assert got16.dtype == torch.bfloat16
    assert torch.equal(got16, got32.bfloat16())  # rounded once, to nearest even, as torch rounds


def _paths():
    paths = [(torch.float32, isa) for isa in F32_ISAS]
    return paths + [(torch.bfloat16, isa) for isa in BF16_ISAS]


@pytest.mark.parametrize("dtype, isa", _paths(), ids=lambda v: str(v).removeprefix("torch."))
def test_row_invariant_bitwise(dtype, isa):
    """Row i of a 32-row call equals the same row computed alone, and within any other subset."""
    gen = torch.Generator().manual_seed(7)
    n, k = 576, 576
    packed = pack(torch.randn(n, k, generator=gen).to(dtype))
    x = torch.randn(32, k, generator=gen).to(dtype)
    many = rowgemm(x, packed, n, isa)
    for i in range(32):
        assert torch.equal(many[i], rowgemm(x[i:i + 1], packed, n, isa)[0]), f"row {i}"
    for start, stop in ((3, 11), (5, 22), (0, 17)):  # other group sizes: 8, 17 (12 + 5 in a register block)
        assert torch.equal(many[start:stop], rowgemm(x[start:stop], packed, n, isa))


@pytest.mark.skipif(not KERNEL.runs_bf16, reason="this CPU runs no bfloat16 path (AVX2 at least)")
@pytest.mark.parametrize("isa", BF16_ISAS)
@pytest.mark.parametrize("n, k", [(96, 64), (160, 576), (33, 1536), (100, 77)])
@pytest.mark.parametrize("rows", [1, 7, 16, 20])
def test_bfloat16_tile_alone_keeps_its_bits(isa, n, k, rows):
    """A packed tile's 32 outputs are the same bits computed alone as beside other tiles, in AMX's one row group
    (up to 16 rows) and in its two (20 rows: both groups share each loaded weight tile)."""
    gen = torch.Generator().manual_seed(n * k + rows)
    weight = torch.randn(n, k, generator=gen).bfloat16()
    packed = pack(weight)
    x = torch.randn(rows, k, generator=gen).bfloat16()
    every = rowgemm(x, packed, n, isa, out_fp32=True)  # 20 rows: AMX's two row groups a step
    exact = x.double() @ weight.double().T
    torch.testing.assert_close(every.double(), exact, rtol=1e-4, atol=1e-3 * k ** 0.5)
    for t in range(packed.shape[0]):
        width = min(32, n - 32 * t)
        alone = rowgemm(x, packed[t:t + 1].contiguous(), width, isa, out_fp32=True)
        assert torch.equal(every[:, 32 * t:32 * t + width], alone), f"tile {t}"


def test_float32_paths_agree_bitwise():
    """AVX-512, AVX2 and scalar accumulate each output in the same order: the same bits."""
    gen = torch.Generator().manual_seed(3)
    weight, x = torch.randn(100, 77, generator=gen), torch.randn(19, 77, generator=gen)
    results = [rowgemm(x, pack(weight), 100, isa) for isa in F32_ISAS]
    for other in results[1:]:
        assert torch.equal(results[0], other)


def test_thread_count_does_not_change_bits():
    gen = torch.Generator().manual_seed(5)
    weight, x = torch.randn(1536, 576, generator=gen), torch.randn(16, 576, generator=gen)
    packed = pack(weight)
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = rowgemm(x, packed, 1536)
        torch.set_num_threads(2)
        two = rowgemm(x, packed, 1536)
    finally:
        torch.set_num_threads(before)
    assert torch.equal(one, two)


def test_bad_shapes_are_refused():
    packed = pack(torch.randn(64, 32))
    with pytest.raises(RuntimeError, match="need float32 x"):
        rowgemm(torch.randn(2, 31), packed, 64)
    with pytest.raises(RuntimeError, match="need float32 x"):
        rowgemm(torch.randn(2, 32).bfloat16(), packed, 64)


@pytest.mark.parametrize("n, k", [(100, 300), (33, 1536), (5, 129)])
# AVX-512's row groups: one up to 12 rows; 13 = 7 + 6, 16 = 10 + 6, 18 = 12 + 6 (on Intel CPUs in chunks of 64
# steps of k: k = 300 and 129 end in a part chunk); 19 = 10 + 9, 25 = 9 + 10 + 6, 32 = 11 + 11 + 10
@pytest.mark.parametrize("rows", [1, 4, 6, 8, 12, 13, 16, 18, 19, 25, 32])
def test_float32_row_groups_keep_the_bits(n, k, rows):
    """Every row count, however AVX-512 splits it into register groups, gives each row the bits of that row
    alone and of the scalar path (one chain over k in order), for k of any length."""
    gen = torch.Generator().manual_seed(n + k + rows)
    packed = pack(torch.randn(n, k, generator=gen))
    x = torch.randn(rows, k, generator=gen)
    scalar = rowgemm(x, packed, n, 0)
    for isa in F32_ISAS[1:]:
        many = rowgemm(x, packed, n, isa)
        assert torch.equal(many, scalar), f"isa {isa}"
        for i in (0, rows - 1):
            assert torch.equal(many[i], rowgemm(x[i:i + 1], packed, n, isa)[0]), f"isa {isa} row {i}"
