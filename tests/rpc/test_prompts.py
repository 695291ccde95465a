"""The router tokenizes without transformers exactly as the engine does with it."""
import pytest

from router.prompts import PromptEncoder
from specdec.errors import InvalidArgument


@pytest.fixture(scope="module")
def encoders():
    from transformers import AutoTokenizer

    from specdec.models.embedded import embedded_target_path

    path = embedded_target_path()
    return PromptEncoder(path, 49152), AutoTokenizer.from_pretrained(path, local_files_only=True)


@pytest.mark.parametrize("text", ["Hello, world!", "  spaces\tand\nnewlines ", "ünïcødé 漢字 🙂", "<|im_start|>x"])
def test_text_matches_transformers(encoders, text):
    mine, theirs = encoders
    assert mine.encode(text) == theirs.encode(text)


def test_chat_matches_transformers(encoders):
    mine, theirs = encoders
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    text = theirs.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    assert mine.encode(messages) == theirs.encode(text, add_special_tokens=False)
    single = theirs.apply_chat_template([{"role": "user", "content": "Yo"}], add_generation_prompt=True,
                                        tokenize=False)
    assert mine.encode("Yo", chat=True) == theirs.encode(single, add_special_tokens=False)


def test_bad_prompts(encoders):
    mine, _ = encoders
    with pytest.raises(InvalidArgument, match="empty"):
        mine.encode("")
    with pytest.raises(InvalidArgument, match="outside the vocabulary"):
        mine.encode([1, -2])
    with pytest.raises(InvalidArgument, match="no tokenizer"):
        PromptEncoder(None, 10).encode("text")
