"""Incremental detokenisation with stop strings.

Decoding token by token splits multi-byte characters and merges spaces differently from decoding
the whole sequence, so we decode everything generated so far and emit the new suffix. We hold back
a trailing incomplete character (U+FFFD) and, when stop strings are set, the last
len(longest stop) - 1 characters, so text that turns out to start a stop string is never emitted.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.full = ""  # decoded text of token_ids
        self.text = ""  # text emitted so far (never retracted)
        self.stopped = False

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return newly emitted text. After a stop string appears, `stopped` is set,
        `token_ids` ends with the token that completed it, and `text` excludes it."""
        if self.tokenizer is None:
            self.token_ids.extend(token_ids)
            return ""
        start = len(self.text)
        for token in token_ids:  # per token, so a stop truncates the ids at the right place
            self.token_ids.append(token)
            decoded = self.tokenizer.decode(self.token_ids, skip_special_tokens=True)
            if decoded.endswith("\ufffd"):
                continue
            self.full = decoded
            if self.stop:
                hits = [i for i in (decoded.find(s, len(self.text)) for s in self.stop) if i >= 0]
                if hits:
                    self.text = decoded[:min(hits)]
                    self.stopped = True
                    break
            self.text = decoded[:max(len(self.text), len(decoded) - self.holdback)]
        return self.text[start:]

    def flush(self) -> str:
        """At the end of a generation that did not stop on a string: emit what was held back."""
        if self.stopped or self.tokenizer is None:
            return ""
        start = len(self.text)
        self.text = self.full
        return self.text[start:]
