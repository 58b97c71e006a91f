"""schemathesis against a live server's own /openapi.json: generated bodies (schema-conforming
and schema-violating) for every POST route that publishes one, each answer checked.

A case passes when the answer is not a 5xx, a 4xx is the documented error object whose message
starts with the field it blames (`field: ...`), and a 200 stream holds no in-stream 5xx error.
`RADIXSERVE_FUZZ_CASES` sets the cases per route and mode (the suite's default is small; the
figures in docs/reliability.md come from a run with it raised).
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


def cases_per_route() -> int:
    return int(os.environ.get("RADIXSERVE_FUZZ_CASES", DEFAULT_CASES))


@dataclass
class FuzzReport:
    cases: Counter[str] = field(default_factory=Counter)  # "POST /path positive" -> count
    statuses: Counter[int] = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    timeouts: list[str] = field(default_factory=list)  # no answer within CLIENT_TIMEOUT_S

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
        report.cases[label] += 1
        body = case.body
        content = json.dumps(body).encode() if isinstance(body, JSON_TYPES) else b""
        try:
            resp = client.post(op.path, content=content, headers=HEADERS)
        except httpx.TimeoutException:  # a slow answer (a loaded CI box) is no broken contract
            report.timeouts.append(f"{label}: {content[:300]!r}")
            return
        report.statuses[resp.status_code] += 1
        why = problem(resp.status_code, resp.headers.get("content-type", ""), resp.text)
        if why:
            report.failures.append(f"{label}: {why} <- {content[:300]!r}")

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
