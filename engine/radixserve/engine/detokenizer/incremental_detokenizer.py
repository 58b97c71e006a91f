"""Incremental detokenization with stop strings: text deltas that never split a UTF-8
character, never leak the start of a stop string that may still complete, and end a request
at the id whose text completes one.

Per request we decode a small window: ids[surr:read] (already committed context) and
ids[surr:] (context + new ids); the difference is new text, committed only when it does not
end in U+FFFD (an incomplete byte sequence). Text that could be the beginning of a stop
string is held back until it either completes the stop (and is trimmed) or diverges.

This is the one owner of stop strings and stop-token trimming (the rules are in
`stop_strings.StopStrings`). While a request has stop strings, `step` takes its new ids one at
a time; the first id whose text completes one finishes the request with FinishMatchedStr, and
`TextStep.num_ids` tells the caller where to cut the ids (the caller tells the scheduler). The
detokenizer process runs every request's outputs through it; the in-process EngineCore runs it
after each scheduler step.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from radixserve.engine.detokenizer.stop_strings import SpecialTokenTexts, StopStrings
from radixserve.engine.ipc.finish_reason import FinishMatchedStr, FinishMatchedToken, FinishReason
from radixserve.engine.ipc.messages import DetokenizeParams

Decode = Callable[[list[int], bool], str]  # (ids, skip_special_tokens) -> text

INITIAL_CONTEXT = 5  # ids of left context decoded with each window (tokenizer merges)


@dataclass(slots=True)
class TextWindow:
    """One incremental decode of a request's ids (seeded with the prompt's last ids)."""

    skip_special_tokens: bool
    ids: list[int]
    read: int  # ids[:read] are decoded into `text`
    surr: int = 0  # ids[surr:read]: the left context decoded with the newer ids
    text: str = ""  # committed text (complete characters)
    pending: str = ""  # decoded after `text`, up to an incomplete character (not committed)


@dataclass(slots=True)
class DecodeState:
    out: TextWindow  # the request's text
    stop: StopStrings
    # Special tokens kept: where stop strings are sought when one could match part of a
    # special token that `out` skips (SGLang seeks them in such text).
    raw: TextWindow | None = None
    sent: int = 0  # characters of out.text already handed out


@dataclass(frozen=True, slots=True)
class TextStep:
    delta: str  # text to send
    finish: FinishReason | None  # the scheduler's, or FinishMatchedStr found in this step
    num_ids: int  # new ids the request keeps: all, or up to the one that completed the string


class IncrementalDetokenizer:
    def __init__(self, decode: Decode, special: SpecialTokenTexts | None = None) -> None:
        self.decode = decode
        self.special = special if special is not None else SpecialTokenTexts.of(())

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> IncrementalDetokenizer:
        """Over a transformers tokenizer (its special tokens: those skip_special_tokens drops)."""

        def decode(ids: list[int], skip_special_tokens: bool) -> str:
            return str(tokenizer.decode(ids, skip_special_tokens=skip_special_tokens))

        added = getattr(tokenizer, "added_tokens_decoder", {})
        special = [t.content for t in added.values() if t.special]
        special += getattr(tokenizer, "all_special_tokens", [])
        return cls(decode, SpecialTokenTexts.of(special))

    def start(self, prompt_ids: list[int], params: DetokenizeParams) -> DecodeState:
        """A request's state, its windows seeded with the prompt's last ids so that the first
        token decodes in context."""
        ctx = list(prompt_ids[-INITIAL_CONTEXT:])
        stop = StopStrings(tuple(params.stop_strs), params.no_stop_trim)
        raw = None
        if params.skip_special_tokens and stop.touch_any(self.special):
            raw = TextWindow(False, list(ctx), len(ctx))
        return DecodeState(TextWindow(params.skip_special_tokens, ctx, len(ctx)), stop, raw)

    def step(self, st: DecodeState, new_ids: list[int], finish: FinishReason | None) -> TextStep:
        """Add a request's new ids (`finish`: the scheduler's reason, if it ended on the last
        one) and return the text to send, the finish reason and the ids kept."""
        kept = 0
        if st.stop.strs:
            # The scheduler's finishing id keeps its reason: length and stop tokens are checked
            # before stop strings (SGLang's order).
            for tok in new_ids if finish is None else new_ids[:-1]:
                kept += 1
                matched = self._push_and_find(st, tok)
                if matched is not None:
                    reason = FinishMatchedStr(matched)
                    return TextStep(self._finish(st, reason), reason, kept)
        rest = new_ids[kept:]
        if (
            isinstance(finish, FinishMatchedToken)
            and not st.stop.no_trim
            and rest
            and rest[-1] == finish.matched
        ):
            rest = rest[:-1]  # the stop token is not part of the text
        self._push(st, rest)
        if finish is not None:
            return TextStep(self._finish(st, finish), finish, len(new_ids))
        end = len(st.out.text) - st.stop.held_back(st.out.text)
        return TextStep(self._emit(st, end), None, len(new_ids))

    def _push(self, st: DecodeState, ids: list[int]) -> None:
        if not ids:
            return
        for w in (st.out, st.raw):
            if w is not None:
                w.ids.extend(ids)
                self._commit(w)

    def _push_and_find(self, st: DecodeState, tok: int) -> str | None:
        """Add one id; the stop string its text completes, if any. Text not committed yet
        (before an incomplete character) counts: the token did produce it."""
        w = st.raw if st.raw is not None else st.out
        searched = len(w.text)
        self._push(st, [tok])
        return st.stop.find(w.text + w.pending, searched)

    def _commit(self, w: TextWindow) -> None:
        prev = self.decode(w.ids[w.surr : w.read], w.skip_special_tokens)
        new = self.decode(w.ids[w.surr :], w.skip_special_tokens)[len(prev) :]
        if new and not new.endswith("\ufffd"):
            w.text += new
            w.surr, w.read = w.read, len(w.ids)
            w.pending = ""
        else:
            w.pending = new.rstrip("\ufffd")

    def _finish(self, st: DecodeState, finish: FinishReason) -> str:
        """The last delta: everything, even an incomplete trailing character, up to where the
        finish reason ends the text."""
        w = st.out
        if w.read < len(w.ids):
            prev = self.decode(w.ids[w.surr : w.read], w.skip_special_tokens)
            w.text += self.decode(w.ids[w.surr :], w.skip_special_tokens)[len(prev) :]
            w.read = len(w.ids)
        end = len(w.text)
        if isinstance(finish, FinishMatchedStr):
            end = st.stop.text_end(w.text, finish.matched)
        return self._emit(st, end)

    @staticmethod
    def _emit(st: DecodeState, end: int) -> str:
        end = max(end, st.sent)
        delta, st.sent = st.out.text[st.sent : end], end
        return delta
