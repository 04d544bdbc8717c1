"""Turning generated tokens into text as they arrive: stop strings and safe stream deltas.

A streamed answer must join to exactly the non-streamed text. Decoding a prefix of the
tokens can end in half a character (byte-level tokenizers split UTF-8 sequences across
tokens; the decoder shows U+FFFD until the rest arrives), and the end of the text seen so far
may be the start of a stop string that the next token completes. Both are held back until
they are settled. An answer that ends inside a character (``max_tokens`` reached, or
cancelled, between the bytes of one) ends before it, not in U+FFFD; a U+FFFD the
model really wrote as the very last character is dropped too, the decoder showing both the
same way.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["TextTracker"]

REPLACEMENT = "\ufffd"


class TextTracker:
    """Follows one request's output tokens; says what text may be released and when a stop
    string has ended it.

    Args:
        tokenizer: Decodes token ids (special tokens removed, as the non-streamed text is).
        stop: Stop strings; the output ends before the first one found (OpenAI's rule).
    """

    def __init__(self, tokenizer: Any, stop: Sequence[str] = ()) -> None:
        self.tokenizer = tokenizer
        self.stop = tuple(stop)
        self.ids: list[int] = []
        self.sent = 0  # characters of the text already released
        self.stopped = False  # a stop string was found
        self._text = ""

    def add(self, ids: Sequence[int]) -> None:
        """Append a step's tokens (nothing more is accepted once a stop string was found)."""
        if self.stopped or not ids:
            return
        self.ids.extend(int(t) for t in ids)
        text = self.tokenizer.decode(self.ids, skip_special_tokens=True)
        if self.stop:
            # Search from a little before the text released so far: a stop string may
            # straddle the boundary.
            start = max(0, self.sent - max(len(s) for s in self.stop))
            hits = [i for i in (text.find(s, start) for s in self.stop) if i >= 0]
            if hits:
                text = text[: min(hits)]
                self.stopped = True
        self._text = text

    @property
    def text(self) -> str:
        """The output so far, cut before a stop string and before a trailing incomplete
        character."""
        return self._text.rstrip(REPLACEMENT)

    def release(self, final: bool = False) -> str:
        """The text that can be sent now and was not sent before.

        Held back unless ``final``: a trailing incomplete character, and a tail that could be
        the start of a stop string. With ``final`` the rest of :attr:`text` (which drops an
        incomplete last character).
        """
        text = self.text if final else self._text
        end = len(text)
        if not final and not self.stopped:
            while end > self.sent and text[end - 1] == REPLACEMENT:
                end -= 1
            for s in self.stop:
                for k in range(min(len(s) - 1, end - self.sent), 0, -1):
                    if text[end - k : end] == s[:k]:
                        end -= k
                        break
        if end <= self.sent:
            return ""
        out = text[self.sent : end]
        self.sent = end
        return out
