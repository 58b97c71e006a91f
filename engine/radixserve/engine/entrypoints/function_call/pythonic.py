"""The pythonic tool-call format (`--tool-call-parser pythonic`, Llama-4 style):
`[get_weather(city="Paris"), get_time()]`, optionally inside `<|python_start|>…<|python_end|>`.

The list is held back until its brackets balance, then parsed with `ast` (literal arguments
only); each call comes out whole, its arguments as JSON. Anything else is text.
"""

from __future__ import annotations

import ast
import json
import re

from .detector import ParseResult, ToolCallDelta

START = re.compile(r"\[\s*[A-Za-z_][\w.]*\(")
MARKERS = ("<|python_start|>", "<|python_end|>")


class PythonicDetector:
    def __init__(self, tool_names: frozenset[str]) -> None:
        self.tool_names = tool_names
        self.buffer = ""
        self.num_calls = 0

    def feed(self, text: str) -> ParseResult:
        self.buffer += text
        for marker in MARKERS:
            self.buffer = self.buffer.replace(marker, "")
        out = ParseResult()
        while True:
            at = self.buffer.find("[")
            if at < 0:
                out.normal_text += self.buffer
                self.buffer = ""
                return out
            out.normal_text += self.buffer[:at]
            self.buffer = self.buffer[at:]
            end = _list_end(self.buffer)
            if end is None and _may_start_calls(self.buffer):
                return out  # wait for the list to close
            end = end if end is not None else 1
            calls = self._calls(self.buffer[:end])
            if calls is None:
                out.normal_text += self.buffer[:end]
            else:
                out.calls += calls
            self.buffer = self.buffer[end:]

    def finish(self) -> ParseResult:
        out = ParseResult(normal_text=self.buffer)
        self.buffer = ""
        return out

    def _calls(self, text: str) -> list[ToolCallDelta] | None:
        """The list `text` as calls, or None when it is not a list of declared calls."""
        try:
            tree = ast.parse(text, mode="eval").body
        except SyntaxError:
            return None
        if not isinstance(tree, ast.List) or not tree.elts:
            return None
        parsed = [_call(node) for node in tree.elts]
        if any(p is None or p[0] not in self.tool_names for p in parsed):
            return None
        out = []
        for name, args in (p for p in parsed if p is not None):
            out.append(ToolCallDelta(self.num_calls, name, ""))
            out.append(ToolCallDelta(self.num_calls, None, json.dumps(args, ensure_ascii=False)))
            self.num_calls += 1
        return out


def _call(node: ast.expr) -> tuple[str, dict[str, object]] | None:
    if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name) or node.args:
        return None
    try:
        args = {kw.arg: ast.literal_eval(kw.value) for kw in node.keywords if kw.arg}
    except ValueError:
        return None
    return node.func.id, args


def _may_start_calls(text: str) -> bool:
    return START.match(text) is not None or bool(re.fullmatch(r"\[\s*[\w.]*", text))


def _list_end(text: str) -> int | None:
    """Index after the bracket closing the list `text` opens (strings skipped), or None."""
    depth, quote, escaped = 0, "", False
    for i, ch in enumerate(text):
        if quote:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == quote:
                quote = ""
        elif ch in "'\"":
            quote = ch
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
            if depth == 0:
                return i + 1
    return None
