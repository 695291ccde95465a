"""The device option: every tensor of a step on the model's device, the TP backend following the
device, and one-line refusals (exit code 2) for a GPU that is not there, too few GPUs for --tp, and a
dtype the device cannot run. GPUs are simulated where a refusal needs one: this machine has none."""
from __future__ import annotations

import traceback
from pathlib import Path

import pytest
import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from specdec import Engine, SamplingParams
from specdec import parallel
from specdec.batch import generate_batch
from specdec.device import check_dtype, placement, resolve_device
from specdec.errors import InvalidArgument

pytestmark = pytest.mark.usefixtures("one_thread")


class DefaultDeviceGuard(TorchDispatchMode):
    """Records every op whose output lands on the meta device. Run under `torch.device("meta")`, a
    tensor made without naming its device lands there: on a GPU it would have been a CPU tensor in
    a CUDA step (a device mismatch, or a host copy per step)."""

    def __init__(self):
        super().__init__()
        self.strays: dict[tuple[str, ...], str] = {}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if any(isinstance(t, torch.Tensor) and t.device.type == "meta" for t in pytree.tree_leaves(out)):
            frames = [f for f in traceback.extract_stack() if "/torch/" not in f.filename][-3:]
            self.strays[tuple(f"{Path(f.filename).name}:{f.lineno}" for f in frames)] = str(func)
        return out


@pytest.mark.parametrize("config", [dict(drafter="none"), dict(drafter="ngram", num_branches=2),
                                    dict(drafter="draft", tree_width=2, num_speculative_tokens=3)],
                         ids=lambda c: c["drafter"])
def test_no_tensor_of_a_step_leaves_the_models_device(tiny_target, tiny_noisy_draft, config):
    draft = tiny_noisy_draft if config["drafter"] == "draft" else None
    engine = Engine.from_pretrained(target=tiny_target, draft=draft, device="cpu", **config)
    assert engine.runner.device == torch.device("cpu")
    prompt = [5, 6, 7, 5, 6, 7, 5]
    for params in (SamplingParams(max_new_tokens=12, ignore_eos=True),
                   SamplingParams(temperature=1.0, seed=3, max_new_tokens=12, ignore_eos=True)):
        want = engine.generate(prompt, params).token_ids
        guard = DefaultDeviceGuard()
        with torch.device("meta"), guard:
            got = engine.generate(prompt, params).token_ids
            generate_batch(engine, [prompt, [9, 8, 7]], params, max_batch=2)
        assert guard.strays == {}, f"tensors made without the model's device: {guard.strays}"
        if params.greedy:
            assert got == want


def test_the_guard_catches_a_stray_tensor():
    guard = DefaultDeviceGuard()
    with torch.device("meta"), guard:
        torch.zeros(2, device="cpu") + 1
        torch.tensor([1, 2]) + 1  # no device named: this one (seen at its first op)
    assert len(guard.strays) == 1


def test_auto_is_the_cpu_without_a_gpu():
    if torch.cuda.is_available():
        pytest.skip("a GPU is visible here")
    assert resolve_device("auto") == torch.device("cpu")
    assert placement("auto", "auto") == (torch.device("cpu"), torch.float32)


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", "", None])
def test_bad_device_spelling(name):
    with pytest.raises(InvalidArgument, match="device must be auto, cpu, cuda or cuda:N"):
        resolve_device(name)


@pytest.fixture
def two_gpus(monkeypatch):
    """What torch reports on a machine with two GPUs without bf16 tensor cores (nothing runs on them)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Tesla T4")
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 5))


def test_gpu_placement_rules(two_gpus, monkeypatch):
    assert resolve_device("auto") == torch.device("cuda", 0)
    assert resolve_device("cuda:1") == torch.device("cuda", 1)
    with pytest.raises(InvalidArgument, match=r"'cuda:2' asked for, but only 2 CUDA devices are visible"):
        resolve_device("cuda:2")
    with pytest.raises(InvalidArgument, match=r"--tp 4 on 'cuda' needs 4 GPUs \(one per rank\), but 2 are visible"):
        resolve_device("cuda", tp_degree=4)
    with pytest.raises(InvalidArgument, match="pass --device cuda"):
        resolve_device("cuda:1", tp_degree=2)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert resolve_device("cuda", tp_degree=2) == torch.device("cuda", 1)  # each rank its own GPU
    assert placement("cuda", "auto", 2)[1] == torch.float16  # no bf16 tensor cores: auto is float16 there


def test_a_dtype_the_device_cannot_run(two_gpus):
    with pytest.raises(InvalidArgument, match=r"dtype bfloat16 cannot run on cuda:0 \(Tesla T4 \(compute capability "
                                              r"7.5\)\); use --dtype float32 or float16"):
        check_dtype(torch.device("cuda", 0), torch.bfloat16)
    check_dtype(torch.device("cuda", 0), torch.float16)
    check_dtype(torch.device("cpu"), torch.bfloat16)  # this CPU computes bf16 (emulated or native)


def test_tp_backend_follows_the_device(monkeypatch):
    assert parallel.backend_for(torch.device("cpu")) == "gloo"
    assert parallel.backend_for(torch.device("cuda", 1)) == "nccl"
    assert parallel.rank_env("cpu") == {"CUDA_VISIBLE_DEVICES": ""}  # CPU ranks never load onto a GPU
    assert parallel.rank_env("cuda") == {}
    calls = []
    monkeypatch.setattr(torch.distributed, "init_process_group", lambda backend, **kw: calls.append((backend, kw)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda device: calls.append(("set_device", device)))
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    threads = torch.get_num_threads()
    parallel.init_from_env(device="cpu")
    parallel.init_from_env(device=torch.device("cuda", 1))
    torch.set_num_threads(threads)
    assert calls[0][0] == "gloo" and "device_id" not in calls[0][1]
    assert calls[1] == ("set_device", torch.device("cuda", 1))
    assert calls[2][0] == "nccl" and calls[2][1]["device_id"] == torch.device("cuda", 1)


def one_line_error(capsys, argv: list[str]) -> str:
    from specdec.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("specdec: error: "), err
    return err[0]


def test_cli_cuda_where_none_is_visible(capsys, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    for argv in (["generate", "--device", "cuda", "hi"], ["generate", "--device", "cuda:0", "--tp", "2", "hi"],
                 ["serve", "target", "--device", "cuda"], ["serve", "--device", "cuda"]):
        assert "no CUDA device is visible" in one_line_error(capsys, argv)


def test_cli_tp_above_the_gpu_count(capsys, two_gpus, tiny_target, monkeypatch):
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    for argv in (["generate", "--target", tiny_target, "--device", "cuda", "--tp", "2", "hi"],
                 ["serve", "target", "--model", tiny_target, "--device", "cuda", "--tp", "2"]):
        assert "--tp 2 on 'cuda' needs 2 GPUs (one per rank), but 1 is visible" in one_line_error(capsys, argv)


def test_cli_dtype_the_device_cannot_run(capsys, two_gpus, tiny_target):
    for argv in (["generate", "--target", tiny_target, "--device", "cuda", "--dtype", "bfloat16", "hi"],
                 ["serve", "draft", "--drafter", "draft", "--model", "random", "--target-model", tiny_target,
                  "--device", "cuda:1", "--dtype", "bfloat16"]):
        assert "dtype bfloat16 cannot run on cuda" in one_line_error(capsys, argv)
