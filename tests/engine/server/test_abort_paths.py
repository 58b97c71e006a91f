"""A client that disconnects mid-generation aborts its request the same way on every route:
/generate (non-stream and stream) and the OpenAI routes (stream and non-stream). Afterwards the
scheduler holds no request and the KV pool is back at rest, and the abort is counted."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable

import httpx
import openai
import pytest

from tests.engine.server.live_server import LiveServer

MODEL = "smollm2-135m"
LONG = 4000  # far more tokens than the test waits for: only an abort ends the request early
CHAT = [{"role": "user", "content": "Count to one million, one number per line."}]


def _load(server: LiveServer) -> dict:
    return httpx.get(server.base_url + "/get_load", timeout=10).json()


def _aborted(server: LiveServer) -> float:
    text = httpx.get(server.base_url + "/metrics", timeout=10).text
    prefix = "radixserve:num_aborted_requests_total"
    lines = [ln for ln in text.splitlines() if ln.startswith(prefix)]
    return float(lines[0].split()[-1]) if lines else 0.0  # no sample before the first abort


def _wait(cond: Callable[[], bool], timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.2)
    return cond()


def _disconnect_mid_generation(
    server: LiveServer, client_call: Callable[[threading.Event], None]
) -> None:
    """Run client_call (which leaves early) in a thread; it must have been running in the
    scheduler; afterwards nothing may be left running and the KV must be free.

    A streaming call sets the event once tokens reached it, which proves the request ran even
    when it was aborted between two polls of /get_load."""
    assert _wait(lambda: _load(server)["num_reqs"] == 0, 30), "server not idle before the test"
    before = _aborted(server)
    errors: list[BaseException] = []
    streamed = threading.Event()

    def run() -> None:
        try:
            client_call(streamed)
        except BaseException as exc:  # reported by the assertion below
            errors.append(exc)

    t = threading.Thread(target=run)
    t.start()
    ran = lambda: streamed.is_set() or _load(server)["num_running_reqs"] >= 1  # noqa: E731
    assert _wait(ran, 30), "request never ran"
    t.join(60)
    assert not t.is_alive() and not errors, errors
    assert _wait(lambda: _load(server)["num_reqs"] == 0, 20), _load(server)
    load = _load(server)
    assert load["num_reqs"] == 0 and load["token_usage"] == 0, load
    assert _wait(lambda: _aborted(server) >= before + 1, 5)


def _sse_lines(resp: httpx.Response, n: int, streamed: threading.Event) -> None:
    """Read n data lines of a stream, then return (the caller closes the connection)."""
    got = 0
    for line in resp.iter_lines():
        if line.startswith("data: ") and line != "data: [DONE]":
            json.loads(line[6:])
            got += 1
            streamed.set()
            if got >= n:
                return
    raise AssertionError("the stream ended before the client left")


NATIVE_BODY = {
    "text": "Count to one million:",
    "sampling_params": {"max_new_tokens": LONG, "ignore_eos": True, "temperature": 0},
}


def test_generate_non_stream_disconnect_aborts(server: LiveServer) -> None:
    def call(streamed: threading.Event) -> None:
        with pytest.raises(httpx.ReadTimeout):  # the client gives up and closes the socket
            httpx.post(
                server.base_url + "/generate", json=NATIVE_BODY, timeout=httpx.Timeout(60, read=3)
            )

    _disconnect_mid_generation(server, call)


def test_generate_stream_disconnect_aborts(server: LiveServer) -> None:
    def call(streamed: threading.Event) -> None:
        body = {**NATIVE_BODY, "stream": True}
        with httpx.stream("POST", server.base_url + "/generate", json=body, timeout=60) as r:
            assert r.status_code == 200
            _sse_lines(r, 3, streamed)

    _disconnect_mid_generation(server, call)


@pytest.fixture(scope="module")
def client(server: LiveServer) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url + "/v1", api_key="x", max_retries=0, timeout=60)


def test_openai_chat_stream_disconnect_aborts(server: LiveServer, client: openai.OpenAI) -> None:
    def call(streamed: threading.Event) -> None:
        stream = client.chat.completions.create(
            model=MODEL,
            messages=CHAT,
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for i, _ in enumerate(stream):
            if i >= 3:  # past the role chunk: generated tokens arrived
                streamed.set()
                break
        stream.close()

    _disconnect_mid_generation(server, call)


def test_openai_chat_non_stream_disconnect_aborts(
    server: LiveServer, client: openai.OpenAI
) -> None:
    def call(streamed: threading.Event) -> None:
        with pytest.raises(openai.APITimeoutError):
            client.with_options(timeout=3).chat.completions.create(
                model=MODEL, messages=CHAT, max_tokens=LONG, extra_body={"ignore_eos": True}
            )

    _disconnect_mid_generation(server, call)


def test_openai_completion_stream_disconnect_aborts(
    server: LiveServer, client: openai.OpenAI
) -> None:
    def call(streamed: threading.Event) -> None:
        stream = client.completions.create(
            model=MODEL,
            prompt="Count:",
            max_tokens=LONG,
            stream=True,
            extra_body={"ignore_eos": True},
        )
        for i, _ in enumerate(stream):
            if i >= 3:  # past the role chunk: generated tokens arrived
                streamed.set()
                break
        stream.close()

    _disconnect_mid_generation(server, call)
