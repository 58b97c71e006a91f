"""Helpers for the fault tests: a /generate SSE stream read on a thread of its own that the test
can cut at any moment (a client disconnect), and readers of the engine's own load reports."""

from __future__ import annotations

import contextlib
import http.client
import json
import random
import socket
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlsplit

import httpx


class LiveStream:
    """One streaming /generate, read on a thread. `chunks` holds every data event as it came;
    `cut()` shuts the socket down under the reader (the server sees the client leave at once,
    even while no event is on its way)."""

    def __init__(self, base_url: str, body: dict[str, Any]) -> None:
        self.chunks: list[dict[str, Any]] = []
        self.status: int | None = None
        self.errors: list[BaseException] = []
        self._cut = threading.Event()
        url = urlsplit(base_url)
        self._conn = http.client.HTTPConnection(url.hostname or "", url.port, timeout=300)
        payload = json.dumps({**body, "stream": True})
        self._conn.request("POST", "/generate", payload, {"Content-Type": "application/json"})
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            resp = self._conn.getresponse()
            self.status = resp.status
            while line := resp.readline():
                text = line.decode().strip()
                if text.startswith("data: ") and text != "data: [DONE]":
                    self.chunks.append(json.loads(text[6:]))
        except BaseException as exc:  # read by the test
            if not self._cut.is_set():
                self.errors.append(exc)

    @property
    def tokens(self) -> int:
        return len(self.chunks[-1].get("output_ids", [])) if self.chunks else 0

    @property
    def last(self) -> dict[str, Any]:
        return self.chunks[-1]

    def cut(self) -> None:
        self._cut.set()
        sock = self._conn.sock
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self._conn.close()

    def join(self, timeout: float = 300) -> None:
        self._thread.join(timeout)
        assert not self._thread.is_alive(), "stream did not end"
        assert not self.errors, self.errors
        self._conn.close()


def load(base_url: str) -> dict[str, Any]:
    out: dict[str, Any] = httpx.get(base_url + "/get_load", timeout=10).json()
    return out


def metric(base_url: str, name: str) -> float:
    """One un-labelled-by-rank counter of the engine's /metrics (0 before its first sample)."""
    text = httpx.get(base_url + "/metrics", timeout=10).text
    for line in text.splitlines():
        if line.startswith(f"radixserve:{name}") and not line.startswith("#"):
            return float(line.split()[-1])
    return 0.0


def wait_until(cond: Callable[[], bool], timeout_s: float, what: str) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.02)


def wait_idle(base_url: str, timeout_s: float = 120) -> dict[str, Any]:
    """Wait for no request on the scheduler; return that load (KV not checked here)."""
    wait_until(lambda: load(base_url)["num_reqs"] == 0, timeout_s, "an idle scheduler")
    return load(base_url)


def assert_kv_at_rest(base_url: str) -> None:
    """No KV token in use once idle. `token_usage` is (pool - free - evictable) / pool on the
    scheduler: a leak leaves it above 0, a double free below (free counts a slot twice)."""
    state = wait_idle(base_url)
    assert state["token_usage"] == 0 and state["num_used_tokens"] == 0, state


def ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(2, vocab) for _ in range(n)]  # 0 and 1 are the unk and eos tokens


def body(prompt: list[int], max_new: int) -> dict[str, Any]:
    params = {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}
    return {"input_ids": prompt, "sampling_params": params}
