"""The checkpoints shipped for the embedded SmolLM2 target: small, bf16, loaded by default, lossless."""
from __future__ import annotations

import json

import pytest
from safetensors import safe_open

from specdec import Engine, SamplingParams
from specdec.drafters.trained import checkpoints_dir

NAMES = ("draft", "medusa", "eagle", "eagle3")
PROMPT = "Write a Python function that returns the square of a number."
PARAMS = SamplingParams(max_new_tokens=24)
pytestmark = pytest.mark.skipif(not all((checkpoints_dir() / n).is_dir() for n in NAMES),
                                reason="trained checkpoints are not shipped in this tree")


def test_shipped_checkpoints_are_small_bf16_and_recorded():
    files = [f for f in checkpoints_dir().rglob("*") if f.is_file()]
    assert sum(f.stat().st_size for f in files) <= 60 * 2**20
    for name in NAMES:
        record = json.loads((checkpoints_dir() / name / "recipe.json").read_text())
        assert record["recipe"] == name and record["result"]["steps"] > 0
        assert (checkpoints_dir() / name / "loss.png").is_file()
        for weights in (checkpoints_dir() / name).glob("*.safetensors"):
            with safe_open(str(weights), "pt") as f:
                dtypes = {str(f.get_slice(k).get_dtype()) for k in f.keys()}
            assert dtypes <= {"BF16", "I32", "I64"}, (weights, dtypes)


@pytest.mark.slow
def test_shipped_defaults_load_and_decode_losslessly(smol_path):
    want = Engine.from_pretrained(target=smol_path).generate(PROMPT, PARAMS, chat=True).token_ids
    for name in NAMES:
        engine = Engine.from_pretrained(target=smol_path, drafter=name)
        out = engine.generate(PROMPT, PARAMS, chat=True)
        assert out.token_ids == want, name
        assert out.stats.num_accepted_tokens > 0, name  # trained: it really drafts what the target says
