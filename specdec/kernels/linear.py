"""A model's linear layers on specdec's own row-invariant kernel (rowgemm.cpp), weights packed once.

`install(model, mode)` swaps every plain nn.Linear of a decoder for a PackedLinear holding the
weight in the kernel's tile layout (specdec.kernels.packing), and each RMSNorm for a one-call
FusedRMSNorm (norm.cpp), and returns which kernel runs and why;
`install(model, "torch")` swaps them back (unpacking is exact). Tensor-parallel (DTensor) weights,
GPUs and dtypes the kernel lacks keep torch's F.linear, with the reason logged once per model.

Why a kernel of our own: torch's CPU GEMMs stream the weights again for every few rows, so a verify
forward over 8-16 rows cost 2x a one-row forward; rowgemm reads each weight tile once for all rows.
And it is row-invariant: a row's output is bitwise the same alone or among 31 others, so a verify
forward and a one-token decode step agree exactly in every linear layer.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from specdec.core.types import check_linear_kernel
from specdec.kernels.build import load_kernel
from specdec.kernels.packing import TILE, pack, unpack

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class KernelChoice:
    """What runs a model's linear layers: 'specdec' or 'torch', and why."""

    kernel: str
    reason: str


def choose(mode: str, device: torch.device, dtype: torch.dtype, tensor_parallel: bool) -> KernelChoice:
    """mode auto | specdec | torch -> the kernel that will run (specdec only where it can)."""
    check_linear_kernel(mode)
    if mode == "torch":
        return KernelChoice("torch", "asked for")
    if device.type != "cpu":
        return KernelChoice("torch", f"rowgemm is a CPU kernel; this model is on {device.type}")
    if tensor_parallel:
        return KernelChoice("torch", "tensor-parallel (DTensor) weights gather through torch")
    kernel = load_kernel()
    if kernel.module is None:
        return KernelChoice("torch", kernel.reason)
    if dtype == torch.bfloat16 and not kernel.runs_bf16:
        return KernelChoice("torch", f"bfloat16 needs AVX2 or better; this CPU runs rowgemm as {kernel.isa}")
    if dtype not in (torch.float32, torch.bfloat16):
        return KernelChoice("torch", f"rowgemm runs float32 and bfloat16, not {dtype}")
    return KernelChoice("specdec", f"rowgemm {kernel.isa}, {str(dtype).removeprefix('torch.')}")


class PackedLinear(torch.nn.Module):
    """nn.Linear's forward on rowgemm: x [..., in] -> [..., out], the weight packed once here."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.out_features, self.in_features = weight.shape
        self.register_buffer("packed", pack(weight.detach()), persistent=False)
        self.bias = None if bias is None else torch.nn.Parameter(bias.detach(), requires_grad=False)
        self.kernel = load_kernel().module

    @property
    def weight(self) -> torch.Tensor:
        """The unpacked [out, in] weight, for code that reads it (built on each access: not for hot paths)."""
        return unpack(self.packed, self.out_features, self.in_features)

    def forward(self, x: torch.Tensor, out_fp32: bool = False, num_out: int | None = None) -> torch.Tensor:
        """num_out: only the first num_out outputs, a whole number of tiles (None: all): their tiles alone
        stream, and each output is the one the whole product gives (a tile's outputs depend on it alone)."""
        num_out = self.out_features if num_out is None else num_out
        if num_out != self.out_features and num_out % TILE:
            raise ValueError(f"a prefix of a packed product is whole tiles of {TILE} outputs, not {num_out}")
        rows = x.reshape(-1, self.in_features)
        if rows.dtype != self.packed.dtype or not rows.is_contiguous():
            rows = rows.to(self.packed.dtype).contiguous()
        packed = self.packed if num_out == self.out_features else self.packed[:num_out // TILE]
        y = self.kernel.rowgemm(rows, packed, num_out, -1, out_fp32)
        if self.bias is not None:
            y = y + self.bias[:num_out]
        return y.view(*x.shape[:-1], num_out)

    def to_linear(self) -> torch.nn.Linear:
        linear = torch.nn.Linear(self.in_features, self.out_features, bias=self.bias is not None,
                                 device=self.packed.device, dtype=self.packed.dtype)
        linear.weight = torch.nn.Parameter(self.weight, requires_grad=False)
        if self.bias is not None:
            linear.bias = self.bias
        return linear


NORMS = frozenset({"LlamaRMSNorm", "MistralRMSNorm", "Qwen2RMSNorm"})  # weight * x / rms(x), nothing else


class FusedRMSNorm(torch.nn.Module):
    """One of NORMS in one kernel call per forward instead of ~6 tensor ops (norm.cpp); row-invariant."""

    def __init__(self, original: torch.nn.Module):
        super().__init__()
        self.original = original  # what install(model, "torch") puts back
        self.kernel = load_kernel().module

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight = self.original.weight
        if x.dtype != weight.dtype or not x.is_contiguous():
            return self.original(x)
        return self.kernel.rmsnorm(x, weight, self.original.variance_epsilon)


def install_with_rows(module: torch.nn.Module, weight: torch.Tensor, mode: str):
    """`install(module, mode)`, plus x [..., in] -> x @ weight.T on the same kernel: for a drafting head
    whose output layer is a block of rows of another model's weight ([out, in], e.g. the target's LM
    head restricted to a reduced vocabulary), packed once here when specdec's kernel runs."""
    if install(module, mode).kernel == "specdec":
        return PackedLinear(weight, None)
    return lambda x: x @ weight.T


def _is_plain(module: torch.nn.Module) -> bool:
    return type(module) is torch.nn.Linear and not hasattr(module.weight, "device_mesh")


def install(model: torch.nn.Module, mode: str) -> KernelChoice:
    """Put `model`'s linear layers on the kernel `mode` resolves to (in place, idempotent); a tied LM
    head stays as it is (ModelRunner packs its own copy for logits)."""
    first = next(model.parameters())
    tensor_parallel = any(hasattr(p, "device_mesh") for p in model.parameters())
    choice = choose(mode, first.device, first.dtype, tensor_parallel)
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    swaps = []
    for name, module in model.named_modules():
        if isinstance(module, FusedRMSNorm):
            continue  # its `original` is what it runs on, not a layer to swap again
        for child_name, child in module.named_children():
            if child is head:
                continue
            if choice.kernel == "specdec" and _is_plain(child):
                swaps.append((module, child_name, PackedLinear(child.weight, child.bias)))
            elif choice.kernel == "specdec" and type(child).__name__ in NORMS:
                swaps.append((module, child_name, FusedRMSNorm(child)))
            elif choice.kernel == "torch" and isinstance(child, PackedLinear):
                swaps.append((module, child_name, child.to_linear()))
            elif choice.kernel == "torch" and isinstance(child, FusedRMSNorm):
                swaps.append((module, child_name, child.original))
    for parent, child_name, replacement in swaps:
        setattr(parent, child_name, replacement)
    if getattr(model, "_specdec_linear_kernel", None) != choice:  # said once per model and choice
        (log.warning if mode == "specdec" and choice.kernel != "specdec" else log.info)(
            "linear layers: %s (%s)", choice.kernel, choice.reason)
        model._specdec_linear_kernel = choice
    return choice
