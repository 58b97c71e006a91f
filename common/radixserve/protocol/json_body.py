"""Request bodies as JSON objects: the one parser of the engine's and the router's HTTP routes,
so both answer a bad body with the same 400 naming the same field. Owns no state; no torch.

Python's `json` takes `NaN`, `Infinity` and `-Infinity`, and turns a literal beyond the float
range (`1e999`) into infinity. Standard JSON has no such numbers: the router could not forward
them (it re-encodes a body with `allow_nan=False` when it adds `data_parallel_rank`: a 500)
and the engine would hand them to sampling. Here each is a `BodyError` naming the field that
holds it, as a path (`temperature`,
`sampling_params.top_p`, `messages[0].content`).
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

_PLAIN_KEY = re.compile(r"[A-Za-z0-9_-]+")  # a key a path shows bare (`a.b`, `logit_bias.5`)


class BodyError(ValueError):
    """A body the server refuses with a 400; the message reads `field: reason`."""

    def __init__(self, field: str, reason: str) -> None:
        super().__init__(f"{field}: {reason}")
        self.field = field


def parse_json_object(raw: bytes) -> dict[str, Any]:
    """`raw` (UTF-8/16/32 JSON, as `json.loads` reads bytes) as a JSON object.

    Raises BodyError for malformed JSON (`body`), another JSON type (`body`) and a non-finite
    number (the path of the first one, in document order).
    """
    # id(value) -> its literal. Only non-finite numbers are kept, so a well-formed body costs
    # one callback per float literal and no walk.
    odd: dict[int, str] = {}
    keep: list[float] = []  # holds the floats whose ids are keys above

    def remember(value: float, literal: str) -> float:
        if not math.isfinite(value):
            odd[id(value)] = literal
            keep.append(value)
        return value

    try:
        body = json.loads(
            raw,
            parse_constant=lambda name: remember(float(name), name),  # NaN, ±Infinity
            parse_float=lambda text: remember(float(text), text),
        )
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise BodyError("body", f"malformed JSON ({exc})") from None
    except RecursionError:  # the C scanner's own limit on nesting
        raise BodyError("body", "JSON nested too deeply") from None
    if not isinstance(body, dict):
        raise BodyError("body", "expected a JSON object")
    found = _first_non_finite(body, odd) if odd else None
    if found is not None:
        path, literal = found
        raise BodyError(path, f"expected a finite number, got {literal} (not valid JSON)")
    return body


def _first_non_finite(body: dict[str, Any], odd: dict[int, str]) -> tuple[str, str] | None:
    """The path and literal of the first remembered number in `body`, depth first in document
    order; None when a repeated key replaced every one (the body no longer holds any).
    Iterative: a body may nest as deep as the scanner allows, deeper than this stack."""
    stack: list[tuple[str, Any]] = [(_join("", k), v) for k, v in reversed(body.items())]
    while stack:
        path, value = stack.pop()
        if isinstance(value, float) and id(value) in odd:
            return path, odd[id(value)]
        if isinstance(value, dict):
            stack += [(_join(path, k), v) for k, v in reversed(value.items())]
        elif isinstance(value, list):
            stack += [(f"{path}[{i}]", v) for i, v in reversed(list(enumerate(value)))]
    return None


def _join(path: str, key: str) -> str:
    if _PLAIN_KEY.fullmatch(key):
        return f"{path}.{key}" if path else key
    return f"{path or 'body'}[{json.dumps(key)}]"
