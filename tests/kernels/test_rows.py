"""The lean forward's element-wise steps (specdec/kernels/layer_rows.h): every path this CPU runs (scalar,
AVX2, AVX-512) gives the bits of transformers' own tensor ops, rotary and residual add alike, for head
sizes whose halves fill whole vectors and ones that leave a tail."""
from __future__ import annotations

import pytest
import torch
from transformers.models.llama.modeling_llama import rotate_half

from specdec.kernels.build import load_kernel

KERNEL = load_kernel()
pytestmark = pytest.mark.skipif(KERNEL.module is None, reason=f"no kernels ({KERNEL.reason})")
PATHS = list(range(KERNEL.module.rows_isa() + 1)) if KERNEL.module is not None else []
DTYPES = [torch.float32, torch.bfloat16]


def bits(t: torch.Tensor) -> torch.Tensor:
    """The raw bits, so that -0.0 and +0.0 differ (torch.equal calls them equal)."""
    return t.view(torch.int32 if t.dtype == torch.float32 else torch.int16)


def values(shape, dtype, seed) -> torch.Tensor:
    """Normal values with some exact zeros of either sign, huge and tiny (subnormal in bf16) ones mixed in."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(*shape, generator=gen)
    pick = torch.randint(0, 12, shape, generator=gen)
    x = torch.where(pick == 0, torch.zeros(()), x)
    x = torch.where(pick == 1, -torch.zeros(()), x)
    x = torch.where(pick == 2, x * 1e30, x)
    x = torch.where(pick == 3, x * 1e-39, x)
    return x.to(dtype)


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("d", [2, 6, 16, 40, 48, 64, 72, 96, 128, 256])
def test_rotary_is_transformers_bitwise(isa, dtype, d):
    rows, heads = 5, 3
    x = values((rows, heads, d), dtype, seed=d)
    angle = torch.randn(rows, d // 2, generator=torch.Generator().manual_seed(7)) * 30
    cos, sin = torch.cat([angle.cos()] * 2, -1).to(dtype), torch.cat([angle.sin()] * 2, -1).to(dtype)
    want = x * cos[:, None] + rotate_half(x) * sin[:, None]  # apply_rotary_pos_emb's three ops
    got = KERNEL.module.rotary(x, cos, sin, isa)
    assert torch.equal(bits(got), bits(want))


@pytest.mark.parametrize("isa", PATHS)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("count", [1, 7, 8, 15, 16, 17, 33, 576, 583])
def test_residual_add_is_torch_bitwise(isa, dtype, count):
    x, y = values((count,), dtype, seed=count), values((count,), dtype, seed=count + 1)
    assert torch.equal(bits(KERNEL.module.residual_add(x, y, isa)), bits(x + y))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rotary_rows_do_not_depend_on_each_other(dtype):
    """A row rotated among 16 is the row rotated alone (the lean forward's row invariance)."""
    x, cos, sin = values((16, 9, 64), dtype, 1), values((16, 64), dtype, 2), values((16, 64), dtype, 3)
    many = KERNEL.module.rotary(x, cos, sin, PATHS[-1])
    for r in (0, 5, 15):
        alone = KERNEL.module.rotary(x[r:r + 1], cos[r:r + 1], sin[r:r + 1], PATHS[-1])
        assert torch.equal(bits(alone[0]), bits(many[r]))


@pytest.mark.parametrize("isa", PATHS[1:])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("hidden", [1, 7, 8, 15, 16, 17, 33, 576, 583])
def test_rms_norm_vector_paths_are_the_scalar_path_bitwise(isa, dtype, hidden):
    """norm_rows.h: the AVX2 and AVX-512 RMSNorm give the scalar reference's bits (its eight running sums in
    order, each product and sum rounded on its own, bf16 to nearest even), whole vectors or a tail, with
    zeros of either sign, huge values (squares past float32's range) and subnormal ones mixed in."""
    x = torch.cat([values((6, hidden), dtype, seed=hidden), torch.randn(3, hidden).to(dtype)])
    weight = values((hidden,), dtype, seed=hidden + 1)
    want = KERNEL.module.rms_norm_rows(x, weight, 1e-5, 0)
    got = KERNEL.module.rms_norm_rows(x, weight, 1e-5, isa)
    assert torch.equal(bits(got), bits(want))
    assert torch.isfinite(want[6:].float()).all()  # plain rows stay finite: the check compares real numbers too
