"""One live run shared by the observability tests: a SmolLM2 engine (`radixserve serve`, JSON
logs, `--log-requests`) and a router in front of it (JSON logs), a few real requests, then
both processes' /metrics and, after they stopped, their whole stderr/stdout logs."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.router.router_proc import router_proc, start_engine, wait_engines

CHAT = {"model": "smollm2-135m", "max_tokens": 8, "temperature": 0}
# User text sent in the run; none of it may appear in the logs without --log-requests-text.
PROMPTS = ("Hello!", "Hello! What is the capital of France?")
STREAM_PROMPT = "Once upon a time"
LOG_FLAGS = ("--log-format", "json", "--log-level", "info")


@dataclass(frozen=True)
class Scrape:
    """Sample name → (family name, family type), of each process."""

    engine: dict[str, tuple[str, str]]
    router: dict[str, tuple[str, str]]

    @property
    def all(self) -> dict[str, tuple[str, str]]:
        return self.engine | self.router


@dataclass(frozen=True)
class LiveRun:
    scrape: Scrape
    engine_log: str  # everything the engine process tree wrote (stdout + stderr)
    router_log: str
    # X-Request-ID sent with each request (the router passes it on) → what the client saw:
    # the usage of a JSON answer, the number of SSE data events of a stream, or "left early"
    sent: dict[str, dict[str, int] | int | str]


def _samples(text: str) -> dict[str, tuple[str, str]]:
    out = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            out[sample.name] = (family.name, family.type)
    return out


def _scrape_when(client: httpx.Client, url: str, sample: str, timeout_s: float = 60) -> str:
    """The /metrics text once `sample` is in it (the abort is counted asynchronously)."""
    deadline = time.monotonic() + timeout_s
    while True:
        text = client.get(url + "/metrics").text
        if sample in _samples(text) or time.monotonic() > deadline:
            return text
        time.sleep(0.2)


def _rid(i: int) -> dict[str, str]:
    return {"X-Request-ID": f"obs-test-{i}"}


def _traffic(client: httpx.Client, url: str) -> dict[str, dict[str, int] | int | str]:
    """Two chats, one full stream, one stream the client leaves early (see LiveRun.sent)."""
    sent: dict[str, dict[str, int] | int | str] = {}
    for i, text in enumerate(PROMPTS):
        body = CHAT | {"messages": [{"role": "user", "content": text}]}
        resp = client.post(url + "/v1/chat/completions", json=body, headers=_rid(i))
        assert resp.status_code == 200, resp.text
        sent[_rid(i)["X-Request-ID"]] = resp.json()["usage"]
    # 48 tokens, streamed: several output chunks, so inter-token latency is observed
    stream = CHAT | {"prompt": STREAM_PROMPT, "stream": True, "max_tokens": 48}
    stream["ignore_eos"] = True
    with client.stream("POST", url + "/v1/completions", json=stream, headers=_rid(2)) as resp:
        assert resp.status_code == 200
        events = [line for line in resp.iter_lines() if line.startswith("data:")]
    assert events[-1] == "data: [DONE]" and len(events) > 3  # read to the end
    sent[_rid(2)["X-Request-ID"]] = len(events) - 1
    # a client that goes away mid-stream: the engine aborts (and counts) the request
    long = stream | {"max_tokens": 400}
    with client.stream("POST", url + "/v1/completions", json=long, headers=_rid(3)) as resp:
        next(line for line in resp.iter_lines() if line.startswith("data:"))
    sent[_rid(3)["X-Request-ID"]] = "left early"
    return sent


def live_run() -> LiveRun:
    started = [start_engine(None, None, *LOG_FLAGS, "--log-requests")]
    try:
        wait_engines(started)  # replaces it if it had to start again on other ports
        engine = started[0]
        with (
            router_proc([engine.url], *LOG_FLAGS, healthy=1) as router,
            httpx.Client(timeout=120) as client,
        ):
            sent = _traffic(client, router.url)
            engine_text = _scrape_when(client, engine.url, "radixserve:num_aborted_requests_total")
            router_text = client.get(router.url + "/metrics").text
            router_log = router.log_path
    finally:
        started[0].stop()
    return LiveRun(
        Scrape(engine=_samples(engine_text), router=_samples(router_text)),
        Path(engine.log_path).read_text(errors="replace"),
        Path(router_log).read_text(errors="replace"),
        sent,
    )
