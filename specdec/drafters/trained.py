"""Where trained drafters come from: a checkpoint dir the user names, or the one shipped for the embedded target.

Checkpoints trained by `specdec train draft|medusa|eagle` for the embedded SmolLM2-135M-Instruct
live in specdec/checkpoints/<name>/ (package data), so `make run` needs no training. A trained head is
tied to the target it was trained on (its features, its LM head), so the shipped ones are only used
with the embedded target; any other target needs its own `specdec train` run and `draft=DIR`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from specdec.errors import InvalidArgument
from specdec.kernels.build import load_kernel


def checkpoints_dir() -> Path:
    return Path(__file__).resolve().parent.parent / "checkpoints"


def shipped_checkpoint(name: str, target) -> Path | None:
    """The shipped checkpoint dir of drafter `name` when `target` (a LoadedModel) is the embedded one."""
    from specdec.models.embedded import CHECKPOINT_NAME

    path = checkpoints_dir() / name
    if Path(target.path).name != CHECKPOINT_NAME or not path.is_dir():
        return None
    return path


def build_self_drafter(name: str, target, draft_path, options: dict, runner_config=None):
    """A Medusa, EAGLE or EAGLE-3 drafter reading `target`'s features, from draft_path or the shipped checkpoint.
    runner_config: the engine's (specdec.models.runner.RunnerConfig; None = default), so the heads run on the
    kernel the target runs on: a runner installs its kernel into the model it is given, the target's here."""
    from specdec.models.runner import ModelRunner, RunnerConfig

    path = Path(draft_path).expanduser() if draft_path is not None else shipped_checkpoint(name, target)
    if path is None:
        raise InvalidArgument(f"no trained {name} drafter is shipped for the target {str(target.path)!r}; "
                              f"train one (specdec train {name} --target PATH --out DIR) and pass draft=DIR")
    runner = ModelRunner(target.model, config=runner_config or RunnerConfig())
    if name == "medusa":
        from specdec.drafters.medusa import MedusaDrafter

        return MedusaDrafter.load(path, runner, **options)
    from specdec.drafters.eagle import EagleDrafter

    return EagleDrafter.load(path, target.model, runner, fused=name == "eagle3", **options)


def draft_dtype(runner) -> torch.dtype:
    """A self-drafting head's dtype beside the target's runner: bfloat16 beside a float32 target where the
    CPU multiplies bfloat16 natively and specdec's kernels run (half the bytes a head streams, and dot-pairs
    do twice an FMA's arithmetic; a draft needs no float32 exactness, as verification decides every token),
    else the target's."""
    if (runner.dtype == torch.float32 and runner.device.type == "cpu" and load_kernel().native_bf16
            and runner.linear_kernel.kernel == "specdec"):
        return torch.bfloat16
    return runner.dtype
