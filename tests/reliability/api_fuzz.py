"""schemathesis against a live server's own /openapi.json: generated bodies (schema-conforming
and schema-violating) for every POST route that publishes one, each answer checked.

A case passes when the answer is not a 5xx, a 4xx is the documented error object whose message
starts with the field it blames (`field: ...`), and a 200 stream holds no in-stream 5xx error.
A case that gets no answer at all (a timeout, a refused or reset connection) fails. Each
generated object body is sent a second time with a number in it replaced by `NaN`,
`Infinity`, `-Infinity` or `1e999` (which Python's `json` reads, standard JSON does not): that
must be a 400 naming the path of that number. `RADIXSERVE_FUZZ_CASES` sets the cases per route
and mode (the suite's default is small; the figures in docs/reliability.md come from a run with
it raised).
"""

from __future__ import annotations

import json
import os
import re
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import httpx
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode

DEFAULT_CASES = 5  # per route and mode in the suite (~1-2 min for both servers on CPU)
CLIENT_TIMEOUT_S = 300
HEADERS = {"content-type": "application/json"}
JSON_TYPES = (dict, list, str, int, float, bool, type(None))
FIELD_FIRST = re.compile(r"^[A-Za-z_][\w.\[\]-]*:")
NON_FINITE = ("NaN", "Infinity", "-Infinity", "1e999")  # 1e999: Python reads it as inf
# Keys the corpus follows to a number: the server shows them bare (`a.b`), and a path of them
# is a field FIELD_FIRST recognizes. A number under another key is left alone.
PLAIN_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_-]*")
_MARK = "radixserve-fuzz-non-finite-7f3a"  # stands in for the literal until it is written


def cases_per_route() -> int:
    return int(os.environ.get("RADIXSERVE_FUZZ_CASES", DEFAULT_CASES))


@dataclass
class FuzzReport:
    cases: Counter[str] = field(default_factory=Counter)  # "POST /path positive" -> count
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)  # each names its case and body

    @property
    def total(self) -> int:
        return sum(self.cases.values())


def problem(status: int, content_type: str, text: str) -> str | None:
    """Why this answer breaks the contract, or None."""
    if status >= 500:
        return f"server error {status}: {text[:300]}"
    if 400 <= status < 500:
        if not content_type.startswith("application/json"):
            return f"{status} not JSON: {text[:200]}"
        body = json.loads(text)
        if body.get("object") != "error" or body.get("code") != status:
            return f"{status} not the error object: {text[:200]}"
        if not FIELD_FIRST.match(str(body.get("message", ""))):
            return f"{status} names no field: {body.get('message')!r}"
        return None
    stream = status == 200 and content_type.startswith("text/event-stream")
    if stream and ('"code": 500' in text or "internal error" in text):
        return f"stream carried a 5xx: {text[-300:]}"
    return None


def with_non_finite(body: dict[str, Any], literal: str) -> tuple[bytes, str]:
    """`body` as JSON with its first number (depth first, reached through plain keys) written
    as `literal`, or with a `temperature` of `literal` added when it has none; and the field
    path the server must name (`sampling_params.top_p`, `messages[0].content`)."""
    found = _first_number(body, "")
    if found is None:
        body, path = {**body, "temperature": _MARK}, "temperature"
    else:
        body, path = found
    text = json.dumps(body).replace(json.dumps(_MARK), literal, 1)
    return text.encode(), path


def _first_number(value: Any, path: str) -> tuple[Any, str] | None:
    """A copy of `value` with its first number replaced by the mark, and that number's path."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return _MARK, path
    if isinstance(value, dict):
        for key, item in value.items():
            sub = f"{path}.{key}" if path else key
            if PLAIN_KEY.fullmatch(key) and (found := _first_number(item, sub)) is not None:
                return {**value, key: found[0]}, found[1]
    if isinstance(value, list) and path:
        for i, item in enumerate(value):
            if (found := _first_number(item, f"{path}[{i}]")) is not None:
                return [*value[:i], found[0], *value[i + 1 :]], found[1]
    return None


def send_case(
    client: httpx.Client, path: str, content: bytes, label: str, report: FuzzReport
) -> httpx.Response | None:
    """POST one case; no answer (timeout, refused or reset connection) is a failure naming the
    case: a server that hangs or dies on a body broke the contract as much as a 500 does."""
    report.cases[label] += 1
    try:
        resp = client.post(path, content=content, headers=HEADERS)
    except httpx.TransportError as exc:
        report.failures.append(f"{label}: no answer ({exc!r}) <- {content[:300]!r}")
        return None
    report.statuses[resp.status_code] += 1
    why = problem(resp.status_code, resp.headers.get("content-type", ""), resp.text)
    if why:
        report.failures.append(f"{label}: {why} <- {content[:300]!r}")
    return resp


def check_non_finite(resp: httpx.Response | None, field_path: str) -> str | None:
    """Why this answer to a body with a non-finite number at `field_path` is wrong, or None."""
    if resp is None or resp.status_code >= 500:
        return None  # already a failure of send_case's (no answer, a server error)
    if resp.status_code != 400:
        return f"answered {resp.status_code}, not a 400 naming {field_path}: {resp.text[:200]}"
    message = str(resp.json().get("message", ""))
    if not message.startswith(f"{field_path}:"):
        return f"400 does not name {field_path}: {message!r}"
    return None


def fuzz(base_url: str, paths: list[str], n_cases: int) -> FuzzReport:
    """Every (route, mode) of `paths` for `n_cases` generated cases against `base_url`."""
    schema = schemathesis.openapi.from_url(base_url + "/openapi.json")
    report = FuzzReport()
    ops = [r.ok() for r in schema.get_all_operations()]
    ops = [op for op in ops if op.method.upper() == "POST" and op.path in paths]
    assert sorted(op.path for op in ops) == sorted(paths), [op.path for op in ops]
    with httpx.Client(base_url=base_url, timeout=CLIENT_TIMEOUT_S) as client:
        for op in ops:
            for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
                _run(op, mode, n_cases, client, report)
    return report


def _run(op: Any, mode: GenerationMode, n: int, client: httpx.Client, report: FuzzReport) -> None:
    label = f"POST {op.path} {mode.value}"

    @settings(
        max_examples=n,
        deadline=None,
        database=None,
        derandomize=True,
        suppress_health_check=list(HealthCheck),
    )
    @given(case=op.as_strategy(generation_mode=mode))
    def one(case: Any) -> None:
        body = case.body
        content = json.dumps(body).encode() if isinstance(body, JSON_TYPES) else b""
        send_case(client, op.path, content, label, report)
        if isinstance(body, dict):
            odd_label = f"POST {op.path} non-finite"
            literal = NON_FINITE[report.cases[odd_label] % len(NON_FINITE)]
            content, field_path = with_non_finite(body, literal)
            resp = send_case(client, op.path, content, odd_label, report)
            if why := check_non_finite(resp, field_path):
                report.failures.append(f"{odd_label}: {why} <- {content[:300]!r}")

    one()


@contextmanager
def steady_traffic(send: Callable[[httpx.Client], httpx.Response]) -> Iterator[list[str]]:
    """Well-formed requests in a loop beside the fuzzer; yields the problems seen (none is the
    promise) and stops the loop on exit. At least one request completes."""
    problems: list[str] = []
    done = threading.Event()
    sent = [0]

    def loop() -> None:
        with httpx.Client(timeout=300) as client:
            while not done.is_set() or sent[0] == 0:
                resp = send(client)
                sent[0] += 1
                if resp.status_code != 200:
                    problems.append(f"{resp.status_code}: {resp.text[:300]}")

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    try:
        yield problems
    finally:
        done.set()
        thread.join(300)
    assert sent[0] > 0
