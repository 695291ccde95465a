"""Tiny random Llama checkpoints for e2e tests: fast on 2 cores, with clear argmax margins.

A large initializer_range makes logits spread widely, so greedy picks never sit on near-ties and
tree verification, plain decoding and the engine agree exactly. They reuse the embedded SmolLM2
tokenizer files so text prompts, chat templates and stop strings work too.
"""
from __future__ import annotations

import shutil
from pathlib import Path

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def make_tiny_llama(out: Path, seed: int, tokenizer_dir: Path | None = None, num_layers: int = 2,
                    hidden_size: int = 64, max_positions: int = 1024) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    vocab_size = 49152 if tokenizer_dir is not None else 512
    config = LlamaConfig(vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                         num_hidden_layers=num_layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max_positions,
                         initializer_range=0.5, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(config).save_pretrained(out)
    for name in TOKENIZER_FILES if tokenizer_dir is not None else ():
        if (tokenizer_dir / name).is_file():
            shutil.copy(tokenizer_dir / name, out / name)
    return out


def make_noisy_copy(src: Path, out: Path, noise: float, seed: int) -> Path:
    """A draft that agrees with the target often but not always: its weights plus Gaussian noise."""
    import torch
    from transformers import LlamaForCausalLM

    if (out / "config.json").is_file():
        return out
    torch.manual_seed(seed)
    model = LlamaForCausalLM.from_pretrained(src, dtype=torch.float32)
    with torch.no_grad():
        for param in model.parameters():
            param.add_(torch.randn_like(param) * noise * param.std())
    model.save_pretrained(out)
    for name in TOKENIZER_FILES:
        if (src / name).is_file():
            shutil.copy(src / name, out / name)
    return out
