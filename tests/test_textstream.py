"""Incremental detokenisation equals decoding the whole sequence, and stop strings cut exactly."""
from __future__ import annotations

import pytest

from specdec.textstream import TextStream

TEXT = "Héllo, wörld! 你好世界 — naïve café.\n  def f(x):\n      return x ** 2  # 😀 emoji"


@pytest.fixture(scope="module")
def tokenizer(smol_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(smol_path)


@pytest.mark.parametrize("chunk", [1, 3, 7])
def test_streamed_text_equals_full_decode(tokenizer, chunk):
    ids = tokenizer.encode(TEXT)
    stream = TextStream(tokenizer)
    pieces = [stream.push(ids[i:i + chunk]) for i in range(0, len(ids), chunk)]
    pieces.append(stream.flush())
    assert "".join(pieces) == tokenizer.decode(ids, skip_special_tokens=True)
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_never_emitted_and_ids_cut(tokenizer):
    ids = tokenizer.encode(TEXT)
    stream = TextStream(tokenizer, stop=("wörld",))
    pieces = [stream.push([t]) for t in ids]
    assert stream.stopped
    assert "".join(pieces) == "Héllo, "
    # The ids end with the token that completed the stop string.
    assert "wörld" in tokenizer.decode(stream.token_ids)
    assert "wörld" not in tokenizer.decode(stream.token_ids[:-1])
    assert stream.token_ids == ids[:len(stream.token_ids)]
