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
    plain = torch.randn(3, hidden, generator=torch.Generator().manual_seed(hidden))
    x = torch.cat([values((6, hidden), dtype, seed=hidden), plain.to(dtype)])
    weight = values((hidden,), dtype, seed=hidden + 1)
    want = KERNEL.module.rms_norm_rows(x, weight, 1e-5, 0)
    got = KERNEL.module.rms_norm_rows(x, weight, 1e-5, isa)
    assert torch.equal(bits(got), bits(want))
    assert torch.isfinite(want[6:].float()).all()  # plain rows stay finite: the check compares real numbers too


SILU_MUL_CHECK = """
import sys, torch, torch.nn.functional as F
from specdec.kernels.build import load_kernel
torch.set_num_threads(1)  # ATen splits a large call between threads mid-run; the lean forward calls it on one
kernel = load_kernel().module
assert kernel.act_isa() == {"DEFAULT": 0, "AVX2": 1, "AVX512": 2}[torch.backends.cpu.get_cpu_capability()]
gen = torch.Generator().manual_seed(0)
every_bf16 = torch.arange(0, 65536, dtype=torch.int32).to(torch.int16).view(torch.bfloat16)
floats = torch.cat([torch.randn(20000, generator=gen) * s for s in (0.1, 1, 10, 100)]
                   + [torch.tensor([0.0, -0.0, float("inf"), -float("inf"), float("nan"), 88.0, -88.0, 1e-40])])
for n in (1, 15, 16, 17, 31, 32, 33, 63, 64, 65, 96, 127, 129, 768, 1537):
    for dtype, gates in ((torch.bfloat16, every_bf16), (torch.float32, floats)):
        rows = (gates.numel() + n - 1) // n
        gate_up = torch.randn(rows, 2 * n + 5, generator=gen).to(dtype) * 3  # gate and up: views with a row stride
        gate_up[:, :n] = torch.cat([gates, gates[:rows * n - gates.numel()]]).to(dtype).view(rows, n)
        gate, up = gate_up[:, :n], gate_up[:, n + 5:]
        want = F.silu(gate)
        want.mul_(up)
        got = kernel.silu_mul_rows(gate, up)
        view = torch.int16 if dtype == torch.bfloat16 else torch.int32
        assert torch.equal(got.view(view), want.view(view)), (dtype, n, int((got.view(view) != want.view(view)).sum()))
print("ok")
"""


@pytest.mark.parametrize("capability", ["default", "avx2", "avx512"])
def test_silu_times_up_is_atens_bitwise_on_every_capability(capability):
    """act_rows.h: silu(gate) * up equals ATen's silu_out then mul_ (what transformers' walk runs) bit for bit,
    NaN bits included, under each CPU capability ATen can run here (ATEN_CPU_CAPABILITY, in a fresh process),
    for every bf16 gate value and float32 ones of many scales, in runs that end in whole vector steps or not."""
    import os
    import subprocess
    import sys

    if capability == "avx512" and KERNEL.module.rows_isa() < 2:
        pytest.skip("this CPU has no AVX-512")
    if capability == "avx2" and KERNEL.module.rows_isa() < 1:
        pytest.skip("this CPU has no AVX2")
    env = dict(os.environ, ATEN_CPU_CAPABILITY=capability)
    run = subprocess.run([sys.executable, "-c", SILU_MUL_CHECK], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0 and run.stdout.strip().endswith("ok"), run.stderr[-2000:]
