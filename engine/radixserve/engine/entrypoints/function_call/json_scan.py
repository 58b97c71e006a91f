"""An incremental look at one JSON object that may still be arriving: where it ends (if it has
ended) and where each top-level member's value starts and ends so far. String-aware (braces
and commas inside strings do not count); no values are decoded but the keys. Pure Python.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field


@dataclass(slots=True)
class Span:
    start: int
    end: int | None = None  # None: the value has not ended yet


@dataclass(slots=True)
class ObjectScan:
    fields: dict[str, Span] = field(default_factory=dict)
    end: int | None = None  # index after the closing brace, once it arrived

    def string(self, text: str, key: str) -> str | None:
        """The member `key`'s value when it is a complete JSON string."""
        span = self.fields.get(key)
        if span is None or span.end is None or text[span.start] != '"':
            return None
        value = json.loads(text[span.start : span.end])
        return value if isinstance(value, str) else None


@dataclass(slots=True)
class _State:
    depth: int = 0
    in_string: bool = False
    escaped: bool = False
    expect: str = "key"  # key | colon | value | in_value | comma (at depth 1)
    key: str = ""
    key_start: int = 0
    primitive: bool = False  # the current depth-1 value is a number / true / false / null


def scan_object(text: str) -> ObjectScan:
    """Scan `text`, which starts with "{", as far as it goes."""
    out, st = ObjectScan(), _State()
    for i, ch in enumerate(text):
        if st.in_string:
            _in_string(text, i, ch, st, out)
        elif ch == '"':
            st.in_string = True
            if st.depth == 1 and st.expect == "value":
                _open_value(i, st, out, primitive=False)
            elif st.depth == 1 and st.expect == "key":
                st.key_start = i
        elif ch in "{[":
            if st.depth == 1 and st.expect == "value":
                _open_value(i, st, out, primitive=False)
            st.depth += 1
        elif ch in "}]":
            _close_primitive(text, i, st, out)
            st.depth -= 1
            if st.depth == 1 and st.expect == "in_value":
                out.fields[st.key].end, st.expect = i + 1, "comma"
            if st.depth == 0:
                out.end = i + 1
                return out
        elif st.depth == 1:
            _depth_one(text, i, ch, st, out)
    return out


def _in_string(text: str, i: int, ch: str, st: _State, out: ObjectScan) -> None:
    if st.escaped:
        st.escaped = False
    elif ch == "\\":
        st.escaped = True
    elif ch == '"':
        st.in_string = False
        if st.depth == 1 and st.expect == "key":
            st.key, st.expect = json.loads(text[st.key_start : i + 1]), "colon"
        elif st.depth == 1 and st.expect == "in_value":
            out.fields[st.key].end, st.expect = i + 1, "comma"


def _open_value(i: int, st: _State, out: ObjectScan, primitive: bool) -> None:
    out.fields[st.key] = Span(i)
    st.expect, st.primitive = "in_value", primitive


def _close_primitive(text: str, i: int, st: _State, out: ObjectScan) -> None:
    """A comma or the closing brace ends a number / literal at depth 1."""
    if st.depth == 1 and st.expect == "in_value" and st.primitive:
        out.fields[st.key].end = len(text[:i].rstrip())
        st.expect, st.primitive = "comma", False


def _depth_one(text: str, i: int, ch: str, st: _State, out: ObjectScan) -> None:
    if ch == ":" and st.expect == "colon":
        st.expect = "value"
    elif ch == ",":
        _close_primitive(text, i, st, out)
        st.expect = "key"
    elif not ch.isspace() and st.expect == "value":
        _open_value(i, st, out, primitive=True)
