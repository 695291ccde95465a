"""Share the tiny feature-cache fixture of tests/drafters; tiny chat targets for the CLI paths."""
import pytest

from drafters.conftest import tiny_features  # noqa: F401


def make_chat_target(tmp_path_factory, smol_path, layers: int):
    """A tiny random Llama with SmolLM2's vocabulary and tokenizer: the CLI path end to end, in seconds."""
    from transformers import AutoTokenizer

    from conftest import make_tiny_llama

    path = make_tiny_llama(tmp_path_factory.mktemp(f"tiny-chat-{layers}"), seed=4, hidden=64, layers=layers,
                           vocab=49152, eos_token_id=2)
    AutoTokenizer.from_pretrained(smol_path).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tiny_chat_target(tmp_path_factory, smol_path):
    return make_chat_target(tmp_path_factory, smol_path, layers=1)


@pytest.fixture(scope="module")
def tiny_deep_chat_target(tmp_path_factory, smol_path):
    """Four layers, so an EAGLE-3 head has low, middle and high layers to fuse."""
    return make_chat_target(tmp_path_factory, smol_path, layers=4)
