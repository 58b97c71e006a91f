"""Incremental detokenization for streaming: text deltas that never split a UTF-8 character
and never leak the start of a stop string that may still complete.

Per request we decode a small window: ids[surr:read] (already committed context) and
ids[surr:] (context + new ids); the difference is new text, committed only when it does not
end in U+FFFD (an incomplete byte sequence). Text that could be the beginning of a stop
string is held back until it either completes the stop (and is trimmed) or diverges.

This is the one place that trims stop tokens and stop strings from output text: the
detokenizer process streams through it, and the in-process EngineCore decodes a finished
request in one step (`decode_finished`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from radixserve.engine.ipc.finish_reason import FinishMatchedStr, FinishMatchedToken, FinishReason

Decode = Callable[[list[int], bool], str]  # (ids, skip_special_tokens) -> text

INITIAL_CONTEXT = 5  # ids of left context decoded with each window (tokenizer merges)


@dataclass(slots=True)
class DecodeState:
    skip_special_tokens: bool
    stop_strs: tuple[str, ...] = ()
    no_stop_trim: bool = False
    ids: list[int] = field(default_factory=list)
    text: str = ""  # committed text (complete characters)
    surr: int = 0
    read: int = 0
    sent: int = 0  # characters of `text` already handed out


def _held_back(text: str, stop_strs: tuple[str, ...]) -> int:
    """Length of the longest suffix of text that is a proper prefix of a stop string."""
    best = 0
    for s in stop_strs:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best


class IncrementalDetokenizer:
    def __init__(self, decode: Decode) -> None:
        self.decode = decode

    def _commit(self, st: DecodeState) -> None:
        prev = self.decode(st.ids[st.surr : st.read], st.skip_special_tokens)
        full = self.decode(st.ids[st.surr :], st.skip_special_tokens)
        if len(full) > len(prev) and not full.endswith("\ufffd"):
            st.text += full[len(prev) :]
            st.surr, st.read = st.read, len(st.ids)

    def step(self, st: DecodeState, new_ids: list[int], finish: FinishReason | None) -> str:
        """Add new ids; return the text delta to send (the finish reason decides the trim)."""
        if (
            isinstance(finish, FinishMatchedToken)
            and not st.no_stop_trim
            and new_ids
            and new_ids[-1] == finish.matched
        ):
            new_ids = new_ids[:-1]  # the stop token is not part of the text
        st.ids.extend(new_ids)
        self._commit(st)
        if finish is None:
            end = len(st.text) - _held_back(st.text, st.stop_strs)
            # A complete stop string means the request is about to finish on it: hold it.
            hits = [p for x in st.stop_strs if (p := st.text.find(x)) >= 0]
            end = min([end, *hits])
        else:
            # Finished: flush everything, even an incomplete trailing character.
            if st.read < len(st.ids):
                prev = self.decode(st.ids[st.surr : st.read], st.skip_special_tokens)
                full = self.decode(st.ids[st.surr :], st.skip_special_tokens)
                st.text += full[len(prev) :]
                st.read = len(st.ids)
            end = len(st.text)
            if isinstance(finish, FinishMatchedStr) and not st.no_stop_trim:
                pos = st.text.find(finish.matched)
                end = pos if pos >= 0 else end
        end = max(end, st.sent)
        delta, st.sent = st.text[st.sent : end], end
        return delta

    @staticmethod
    def start(prompt_ids: list[int], state: DecodeState) -> DecodeState:
        """Seed the window with the prompt's last ids so the first token decodes in context."""
        ctx = prompt_ids[-INITIAL_CONTEXT:]
        state.ids = list(ctx)
        state.surr = 0
        state.read = len(ctx)
        return state


def decode_finished(
    decode: Decode,
    prompt_ids: list[int],
    output_ids: list[int],
    finish: FinishReason | None,
    state: DecodeState,
) -> str:
    """The whole output text of a finished request, trimmed exactly as a stream would be."""
    IncrementalDetokenizer.start(prompt_ids, state)
    return IncrementalDetokenizer(decode).step(state, output_ids, finish)
