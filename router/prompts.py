"""Prompt -> token ids without transformers, matching `Engine.encode` exactly.

tokenizer.json is read with `tokenizers`; the chat template (chat_template.jinja, or the
`chat_template` key of tokenizer_config.json) is rendered the way transformers renders it:
a sandboxed jinja2 environment with trim_blocks / lstrip_blocks and the special tokens as variables.
Text is encoded through `encode_batch`, which (unlike `encode`) lets go of the GIL while it runs, so
a long prompt being tokenized never stalls the router's other threads.
"""
from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from specdec.errors import InvalidArgument


def _token_text(value) -> str | None:
    return value.get("content") if isinstance(value, dict) else value


class PromptEncoder:
    def __init__(self, model_dir: str | Path | None, vocab_size: int):
        self.vocab_size = vocab_size
        self.tokenizer = None
        self.template = None
        self.special: dict[str, str] = {}
        if model_dir is None:
            return
        model_dir = Path(model_dir)
        if (model_dir / "tokenizer.json").is_file():
            from tokenizers import Tokenizer

            self.tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
        config_path = model_dir / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.is_file() else {}
        source = (model_dir / "chat_template.jinja").read_text() if (model_dir / "chat_template.jinja").is_file() \
            else config.get("chat_template")
        self.special = {k: _token_text(v) for k, v in config.items() if k.endswith("_token") and _token_text(v)}
        if isinstance(source, str):
            self.template = self._compile(source)

    @staticmethod
    def _compile(source: str):
        from jinja2.ext import loopcontrols
        from jinja2.sandbox import ImmutableSandboxedEnvironment

        def raise_exception(message):
            raise InvalidArgument(f"chat template: {message}")

        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
        env.filters["tojson"] = lambda x, indent=None, **_: json.dumps(x, ensure_ascii=False, indent=indent)
        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(source)

    def encode(self, prompt, chat: bool = False) -> list[int]:
        if isinstance(prompt, str):
            if not prompt:
                raise InvalidArgument("prompt is empty")
            if self.tokenizer is None:
                raise InvalidArgument("this model has no tokenizer: pass the prompt as a list of token ids")
            if not chat:
                return self._encode(prompt, add_special_tokens=True)
            prompt = [{"role": "user", "content": prompt}]
        if isinstance(prompt, list) and prompt and all(isinstance(m, dict) for m in prompt):
            if self.tokenizer is None or self.template is None:
                raise InvalidArgument("chat messages need a tokenizer with a chat template")
            text = self.template.render(messages=prompt, add_generation_prompt=True, **self.special)
            return self._encode(text, add_special_tokens=False)
        if not prompt:
            raise InvalidArgument("prompt is empty")
        for token in prompt:
            if not isinstance(token, int) or not 0 <= token < self.vocab_size:
                raise InvalidArgument(f"prompt token id {token!r} is outside the vocabulary [0, {self.vocab_size})")
        return list(prompt)

    def _encode(self, text: str, add_special_tokens: bool) -> list[int]:
        return self.tokenizer.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def longest_token_bytes(self) -> int:
        """The most UTF-8 bytes of text one token stands for (0 without a tokenizer)."""
        if self.tokenizer is None:
            return 0
        size = self.tokenizer.get_vocab_size()
        texts = self.tokenizer.decode_batch([[i] for i in range(size)], skip_special_tokens=False)
        return max(len(text.encode("utf-8")) for text in texts)
