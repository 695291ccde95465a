"""Incremental detokenisation with stop strings.

Decoding token by token splits multi-byte characters and merges spaces differently from decoding
the whole sequence; decoding everything every step costs O(n^2) over a long generation. So, as
text-generation-inference does, we decode a short window twice: the tokens from `prefix_offset` to
`read_offset` (already emitted) and from `prefix_offset` to the end; the difference is the new text,
held back while it ends in an incomplete character (U+FFFD). With stop strings set we also hold back
the last len(longest stop) - 1 characters, so text that turns out to start a stop string is never
emitted.
"""
from __future__ import annotations


class TextStream:
    def __init__(self, tokenizer, stop: tuple[str, ...] = ()):
        self.tokenizer = tokenizer
        self.stop = stop
        self.holdback = max((len(s) for s in stop), default=1) - 1
        self.token_ids: list[int] = []
        self.full = ""  # decoded text of token_ids[:read_offset]
        self.text = ""  # text emitted so far (never retracted)
        self.stopped = False
        self.prefix_offset = 0
        self.read_offset = 0

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    def _advance(self) -> None:
        """Move newly decodable tokens into self.full."""
        prefix = self._decode(self.token_ids[self.prefix_offset:self.read_offset])
        window = self._decode(self.token_ids[self.prefix_offset:])
        if len(window) > len(prefix) and not window.endswith("\ufffd"):
            self.full += window[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.token_ids)

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return newly emitted text. After a stop string appears, `stopped` is set,
        `token_ids` ends with the token that completed it, and `text` excludes it."""
        if self.stopped:
            return ""
        if self.tokenizer is None:
            self.token_ids.extend(token_ids)
            return ""
        start = len(self.text)
        for token in token_ids:  # per token, so a stop truncates the ids at the right place
            self.token_ids.append(token)
            self._advance()
            if self.stop:
                hits = [i for i in (self.full.find(s, len(self.text)) for s in self.stop) if i >= 0]
                if hits:
                    self.text = self.full[:min(hits)]
                    self.stopped = True
                    break
            self.text = self.full[:max(len(self.text), len(self.full) - self.holdback)]
        return self.text[start:]

    def flush(self) -> str:
        """At the end of a generation that did not stop on a string: emit what was held back."""
        if self.stopped or self.tokenizer is None:
            return ""
        start = len(self.text)
        self.text = self.full
        return self.text[start:]
