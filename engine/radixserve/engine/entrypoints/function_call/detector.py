"""Streaming tool-call detection: text in, normal text and tool-call deltas out, in OpenAI's
order (a call's name first, then its arguments as they arrive). The whole answer at once is
the same as the stream fed in any pieces, so non-streamed and streamed answers agree.

`arguments` is the model's own JSON text of the arguments (OpenAI passes it through as
generated). A call naming no declared tool is dropped (SGLang's default). Text that might be
the start of a marker is held back until it is clearly not one. Main process, per choice.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .formats import JsonToolFormat
from .json_scan import ObjectScan, scan_object

SEPARATORS = " \t\r\n;,[]"


@dataclass(frozen=True, slots=True)
class ToolCallDelta:
    index: int
    name: str | None  # set on a call's first delta only
    arguments: str


@dataclass(slots=True)
class ParseResult:
    normal_text: str = ""
    calls: list[ToolCallDelta] = field(default_factory=list)


@dataclass(slots=True)
class _Call:
    name_sent: bool = False
    skip: bool = False  # names no declared tool
    args_sent: int = 0


class JsonToolDetector:
    def __init__(self, fmt: JsonToolFormat, tool_names: frozenset[str]) -> None:
        self.fmt = fmt
        self.tool_names = tool_names
        self.buffer = ""
        self.in_calls = False
        self.started = False  # any text seen (llama3's bare '{' counts only at the start)
        self.call = _Call()
        self.num_calls = 0  # complete calls so far (the next call's index)

    def feed(self, text: str) -> ParseResult:
        out = ParseResult()
        self.buffer += text
        while self._step(out):
            pass
        return out

    def finish(self) -> ParseResult:
        """End of the answer: what was held back is text (an unfinished call is dropped)."""
        out = ParseResult()
        if not self.in_calls:
            out.normal_text, self.buffer = self.buffer, ""
        return out

    def _step(self, out: ParseResult) -> bool:
        """One move through the buffer; False when it needs more text."""
        if not self.in_calls:
            return self._text(out)
        rest = self._skip_separators(self.buffer)
        if not rest:
            self.buffer = ""
            return False
        if rest[0] == "{":
            self.buffer = rest
            return self._object(out)
        if any(tok and tok.startswith(rest) for tok in (self.fmt.bot_token, self.fmt.eot_token)):
            self.buffer = rest  # maybe the start of a marker: wait
            return False
        self.in_calls, self.buffer = False, rest  # text after the calls
        return True

    def _text(self, out: ParseResult) -> bool:
        buf, bot = self.buffer, self.fmt.bot_token
        if self.fmt.bare_start and not self.started and buf.lstrip().startswith("{"):
            self.in_calls, self.started = True, True
            return True
        at = buf.find(bot) if bot else 0
        if at >= 0:
            out.normal_text += buf[:at]
            self.buffer, self.in_calls, self.started = buf[at + len(bot) :], True, True
            return True
        keep = _partial_suffix(buf, bot)
        if self.fmt.bare_start and not self.started and not buf.strip():
            keep = len(buf)  # only whitespace yet: a call may still open the answer
        out.normal_text += buf[: len(buf) - keep]
        self.buffer = buf[len(buf) - keep :]
        self.started = self.started or bool(out.normal_text.strip())
        return False

    def _skip_separators(self, text: str) -> str:
        while True:
            text = text.lstrip(SEPARATORS)
            for tok in (self.fmt.eot_token, self.fmt.bot_token):
                if tok and text.startswith(tok):
                    text = text[len(tok) :]
                    break
            else:
                return text

    def _object(self, out: ParseResult) -> bool:
        scan = scan_object(self.buffer)
        self._emit(scan, out)
        if scan.end is None:
            return False
        if self.call.name_sent and not self.call.skip:
            self.num_calls += 1
        self.buffer, self.call = self.buffer[scan.end :], _Call()
        return True

    def _emit(self, scan: ObjectScan, out: ParseResult) -> None:
        call, text = self.call, self.buffer
        if not call.name_sent:
            name = scan.string(text, "name")
            if name is None:
                return
            call.name_sent, call.skip = True, name not in self.tool_names
            if not call.skip:
                out.calls.append(ToolCallDelta(self.num_calls, name, ""))
        if call.skip:
            return
        span = next((scan.fields[k] for k in self.fmt.args_keys if k in scan.fields), None)
        if span is not None:
            raw = text[span.start : span.end if span.end is not None else len(text)]
        elif scan.end is not None:
            raw = "{}"  # a complete call without arguments
        else:
            return
        if len(raw) > call.args_sent:
            out.calls.append(ToolCallDelta(self.num_calls, None, raw[call.args_sent :]))
            call.args_sent = len(raw)


def _partial_suffix(text: str, token: str) -> int:
    """Length of the longest end of `text` that starts `token` (held back: may be a marker)."""
    for n in range(min(len(text), len(token) - 1), 0, -1):
        if token.startswith(text[-n:]):
            return n
    return 0
