"""`--log-format json` and `--log-requests` on live processes: everything the engine process
tree (HTTP server, scheduler, detokenizer) and the router wrote during the shared live run
parses line by line as JSON, each request has one request line with its counts and no user
text, and a healthy run says nothing at WARNING."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.observability.live_run import PROMPTS, STREAM_PROMPT, LiveRun

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

REQUEST_FIELDS = (
    "request_id", "rid", "prompt_tokens", "completion_tokens", "cached_tokens", "ttft_s",
    "e2e_s", "queue_time_s", "finish_reason",
)  # fmt: skip


def records(log: str) -> list[dict[str, Any]]:
    out = []
    for n, line in enumerate(log.splitlines(), 1):
        entry = json.loads(line)  # raises on any line that is not one JSON document
        assert isinstance(entry, dict), f"line {n}: {line!r}"
        assert {"ts", "level", "logger", "msg"} <= entry.keys(), f"line {n}: {line!r}"
        out.append(entry)
    return out


def request_lines(live: LiveRun) -> dict[str, dict[str, Any]]:
    lines = [r for r in records(live.engine_log) if r["logger"] == "radixserve.requests"]
    by_id = {r["request_id"]: r for r in lines if r["request_id"] in live.sent}
    assert len(by_id) == len([r for r in lines if r["request_id"] in live.sent])  # one each
    return by_id


def test_every_line_of_engine_and_router_is_one_json_object(live: LiveRun) -> None:
    engine, router = records(live.engine_log), records(live.router_log)
    processes = {r.get("process") for r in engine}
    assert {"serve", "scheduler-0-tp0"} <= processes  # the children log in JSON too
    assert any(r["logger"].startswith("uvicorn") for r in router)  # uvicorn's records too
    assert any(r["logger"] == "radixserve.status" for r in engine)  # "serving on …"


def test_one_request_line_per_request_with_the_clients_counts(live: LiveRun) -> None:
    lines = request_lines(live)
    assert set(lines) == set(live.sent)  # the X-Request-ID passed through the router
    for rid, seen in live.sent.items():
        line = lines[rid]
        assert line["level"] == "INFO" and set(REQUEST_FIELDS) <= line.keys(), line
        assert 0 <= line["queue_time_s"] <= line["ttft_s"] <= line["e2e_s"], line
        if isinstance(seen, dict):  # a JSON answer: its usage, as the openai client reads it
            assert line["prompt_tokens"] == seen["prompt_tokens"], line
            assert line["completion_tokens"] == seen["completion_tokens"], line
            cached = seen.get("prompt_tokens_details", {}).get("cached_tokens", 0)
            assert line["cached_tokens"] == cached, line
            assert line["finish_reason"] in ("stop", "length"), line
        elif isinstance(seen, int):  # a stream read to its end: one token per data event
            assert (line["completion_tokens"], line["finish_reason"]) == (seen, "length"), line
        else:
            assert line["finish_reason"] == "client_gone", line


def test_no_user_text_in_any_log_by_default(live: LiveRun) -> None:
    for text in (*PROMPTS, STREAM_PROMPT, "capital of France"):
        assert text not in live.engine_log and text not in live.router_log, text
    for line in request_lines(live).values():
        assert "prompt_text" not in line and "output_text" not in line


def test_router_request_lines_carry_the_request_id(live: LiveRun) -> None:
    access = [r for r in records(live.router_log) if r["logger"] == "uvicorn.access"]
    posts = [r for r in access if "POST /v1/" in r["msg"]]
    assert len(posts) == len(live.sent)
    assert {r["request_id"] for r in posts} == set(live.sent)
    assert all(r.get("request_id") for r in access)  # probes get a fresh id each


def test_a_healthy_run_logs_nothing_at_warning(live: LiveRun) -> None:
    router = records(live.router_log)
    healthy = [r for r in router if r["msg"].startswith("worker healthy")]
    assert healthy and all(r["level"] == "INFO" for r in healthy)
    for r in router + records(live.engine_log):
        assert r["level"] in ("DEBUG", "INFO"), r
