"""Which draft model drafter "draft" uses: a named checkpoint, the shipped one (embedded target only), or the
untrained stand-in when asked for by name (draft="random"); never a random model by default."""
from __future__ import annotations

import pytest
import torch

from specdec import Engine, SamplingParams
from specdec.errors import InvalidArgument
from specdec.serving_config import DraftConfig

GREEDY = SamplingParams(max_new_tokens=12, ignore_eos=True)
REFUSAL = r"no trained draft model is shipped for the target .*pass draft=DIR, or draft='random'"
pytestmark = pytest.mark.usefixtures("one_thread")


def test_no_checkpoint_for_another_target_is_refused(tiny_target):
    with pytest.raises(InvalidArgument, match=REFUSAL):
        Engine.from_pretrained(target=tiny_target, drafter="draft")


def test_draft_worker_without_a_model_is_refused(tiny_target):
    from draft_service.server import build_drafter

    with pytest.raises(InvalidArgument, match=REFUSAL):
        build_drafter(DraftConfig(drafter="draft", target_model=tiny_target, dtype="float32"))


def test_random_is_only_a_draft_model(tiny_target):
    with pytest.raises(InvalidArgument, match="exists only for drafter 'draft', not 'medusa'"):
        Engine.from_pretrained(target=tiny_target, drafter="medusa", draft="random")


def test_random_stand_in_by_name_leaves_the_global_rng_alone(tiny_target, tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "a"))
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    engine = Engine.from_pretrained(target=tiny_target, drafter="draft", draft="random", dtype="float32")
    assert torch.equal(torch.rand(4), expected)  # building the stand-in drew nothing from the global RNG
    (built,) = (tmp_path / "a").iterdir()
    plain = Engine.from_pretrained(target=tiny_target, dtype="float32")
    assert engine.generate([1, 2, 3], GREEDY).token_ids == plain.generate([1, 2, 3], GREEDY).token_ids

    from draft_service.server import build_drafter  # the draft worker's spelling builds the same weights
    from safetensors.torch import load_file

    monkeypatch.setenv("SPECDEC_CACHE", str(tmp_path / "b"))
    _, path, _ = build_drafter(DraftConfig(drafter="draft", model="random", target_model=tiny_target, dtype="float32"))
    a, b = load_file(built / "model.safetensors"), load_file(f"{path}/model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
