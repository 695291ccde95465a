"""A tiny chat model for the benchmark tests: character-level tokenizer with a chat template, a
random Llama target and draft over its vocabulary, and a small Spec-Bench-shaped question file."""
from __future__ import annotations

import json

import pytest
import torch

SPECIALS = ["<unk>", "<|user|>", "<|assistant|>", "<|end|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|user|>{{ m['content'] }}<|end|>{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def save_char_tokenizer(path) -> int:
    """A character-level tokenizer (printable ASCII) with a chat template; returns its vocabulary size."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {token: i for i, token in enumerate(SPECIALS + [chr(c) for c in range(32, 127)])}
    raw = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    raw.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    raw.decoder = decoders.Fuse()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=raw, unk_token="<unk>", eos_token="<|end|>")
    tokenizer.add_special_tokens({"additional_special_tokens": SPECIALS[1:3]})
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(path)
    return len(vocab)


def save_tiny_llama(path, vocab_size: int, seed: int, hidden: int, layers: int) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=1024, initializer_range=0.5, bos_token_id=None,
                         eos_token_id=None, pad_token_id=None)
    LlamaForCausalLM(config).save_pretrained(path)


@pytest.fixture(scope="session")
def chat_models(tmp_path_factory):
    """(target dir, draft dir): tiny random Llamas sharing a character-level chat tokenizer."""
    target, draft = tmp_path_factory.mktemp("bench-target"), tmp_path_factory.mktemp("bench-draft")
    vocab_size = save_char_tokenizer(target)
    save_char_tokenizer(draft)
    save_tiny_llama(target, vocab_size, seed=1, hidden=64, layers=2)
    save_tiny_llama(draft, vocab_size, seed=2, hidden=32, layers=1)
    return str(target), str(draft)


QUESTIONS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem about the sea.", "Now shorter."]},
    {"question_id": 2, "category": "writing", "turns": ["Write a haiku.", "Again."]},
    {"question_id": 3, "category": "roleplay", "turns": ["Pretend to be a pirate.", "Stop."]},
    {"question_id": 4, "category": "translation", "turns": ["Translate German to English: Guten Tag"]},
    {"question_id": 5, "category": "translation", "turns": ["Translate German to English: Danke"]},
    {"question_id": 6, "category": "qa", "turns": ["Who wrote Hamlet?"]},
    {"question_id": 7, "category": "qa", "turns": ["What is the capital of France?"]},
    {"question_id": 8, "category": "summarization", "turns": ["Summarize: the cat sat on the mat. the cat sat."]},
]


@pytest.fixture()
def question_file(tmp_path):
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    return path
