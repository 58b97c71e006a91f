"""StopStrings: a request's stop strings, applied to its output text — which one the newest
text completes, how much text to hold back while streaming, where the text ends.

Stop strings belong to the text side: the scheduler knows stop token ids only. The incremental
detokenizer uses this module on each request's text, in the detokenizer process and, per
step, in the in-process EngineCore. SGLang's rules: the first stop string (in the request's
order) that the newest token's text completes ends the request; the text ends before the
string's first occurrence unless `no_stop_trim`; a streamed text never shows the start of a
stop string that may still complete.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class StopStrings:
    strs: tuple[str, ...] = ()
    no_trim: bool = False  # `no_stop_trim`: keep the matched stop string (or stop token)

    def find(self, text: str, start: int) -> str | None:
        """The first stop string (in the request's order) that occurs in `text` ending after
        `start`; text up to `start` was searched before and held none."""
        for s in self.strs:
            if text.find(s, max(0, start - len(s) + 1)) >= 0:
                return s
        return None

    def held_back(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of a stop string:
        what a stream must not send yet."""
        best = 0
        for s in self.strs:
            for k in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:k]):
                    best = k
                    break
        return best

    def text_end(self, text: str, matched: str) -> int:
        """Where the text of a request that finished on `matched` ends: before the string's
        first occurrence, or at the end with `no_stop_trim` (or when the text lacks it: it was
        found where special tokens show and this text skips them)."""
        pos = -1 if self.no_trim else text.find(matched)
        return pos if pos >= 0 else len(text)

    def touch_any(self, special: SpecialTokenTexts) -> bool:
        """Whether some stop string could match text that holds part of a special token."""
        return any(special.touches(s) for s in self.strs)


@dataclass(frozen=True, slots=True)
class SpecialTokenTexts:
    """A tokenizer's special-token texts, indexed so that a request's stop strings are
    checked against them in a few set lookups (Llama 3 has 256 special tokens)."""

    texts: frozenset[str]
    joined: str  # the texts NUL-separated: `s in joined` is s inside one of them
    prefixes: frozenset[str]  # their proper prefixes
    suffixes: frozenset[str]  # their proper suffixes

    @classmethod
    def of(cls, texts: Iterable[str]) -> SpecialTokenTexts:
        texts = frozenset(t for t in texts if t)
        return cls(
            texts,
            "\0".join(sorted(texts)),
            frozenset(t[:k] for t in texts for k in range(1, len(t))),
            frozenset(t[-k:] for t in texts for k in range(1, len(t))),
        )

    def touches(self, s: str) -> bool:
        """Whether text matching `s` can hold part of a special token's text: s lies inside
        one, holds one, starts with the end of one or ends with the start of one."""
        if "\0" not in s and s in self.joined:
            return True
        if any(t in s for t in self.texts):
            return True
        return any(s[:k] in self.suffixes or s[-k:] in self.prefixes for k in range(1, len(s)))
