"""Limits under abuse, on one tiny engine and a router in front of it, both started here with a
64 KiB body limit and a 2 s header deadline, so the limits are cheap to reach (the router by
its flags; the engine by its `--max-request-body-bytes` flag and the environment variable
`RADIXSERVE_HEADER_TIMEOUT_S`, so both ways of setting a limit are exercised):

- a body over the limit is a JSON 413 naming the limit, by Content-Length or by a chunked
  upload that passes it; a body under it is judged on its content as before;
- many SSE streams whose client reads nothing hold a bounded amount of memory (resident set
  of every process, read from /proc), are generated in full without a reader (nothing left
  for a well-formed request to queue behind; it is served beside them, and none is cut),
  and free their KV when the clients leave;
- a flood of connections to the router (idle ones and ones that stop half-way through their
  headers) does not stop it answering, and its open file descriptors return to where they
  were once the flood ends (/proc/<pid>/fd).
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.server.live_server import LiveServer, live_server
from tests.reliability.conftest import save_tiny_checkpoint
from tests.reliability.live_streams import assert_kv_at_rest, metric, wait_until
from tests.router.router_proc import Router, router_proc

LIMIT = 65536
HEADER_TIMEOUT_S = 2
ENV = {"RADIXSERVE_HEADER_TIMEOUT_S": str(HEADER_TIMEOUT_S)}
WELL_FORMED = {
    "input_ids": [5, 6, 7, 8],
    "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True},
}


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveServer]:
    folder: Path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))
    with live_server(
        "--model-path", str(folder), "--max-total-tokens", "16384",
        "--max-request-body-bytes", str(LIMIT), env=ENV,
    ) as srv:  # fmt: skip
        yield srv


@pytest.fixture(scope="module")
def router(engine: LiveServer) -> Iterator[Router]:
    limits = ("--max-request-body-bytes", str(LIMIT), "--header-timeout-s", str(HEADER_TIMEOUT_S))
    with router_proc([engine.base_url], *limits, healthy=1) as proc:
        yield proc


def _urls(engine: LiveServer, router: Router) -> list[str]:
    return [engine.base_url, router.url]


def _assert_413(resp: httpx.Response) -> None:
    assert resp.status_code == 413, (resp.status_code, resp.text[:300])
    err = resp.json()
    assert err["object"] == "error" and err["code"] == 413 and err["param"] == "body", err
    assert f"limit of {LIMIT} bytes" in err["message"], err


def test_body_over_the_limit_is_a_413_naming_it(engine: LiveServer, router: Router) -> None:
    big = json.dumps({"text": "t5 " * LIMIT, "sampling_params": {"max_new_tokens": 1}})
    under = json.dumps({"text": "t5 " * (LIMIT // 4), "sampling_params": {"max_new_tokens": 1}})
    assert len(under) < LIMIT < len(big)

    def chunked() -> Iterator[bytes]:  # no Content-Length: counted as it arrives
        for i in range(0, len(big), 8192):
            yield big[i : i + 8192].encode()

    for url in _urls(engine, router):
        headers = {"Content-Type": "application/json"}
        _assert_413(httpx.post(url + "/generate", content=big, headers=headers, timeout=60))
        _assert_413(httpx.post(url + "/generate", content=chunked(), headers=headers, timeout=60))
        _assert_413(httpx.post(url + "/v1/completions", content=big, headers=headers, timeout=60))
        resp = httpx.post(url + "/generate", content=under, headers=headers, timeout=60)
        assert resp.status_code == 400 and resp.json()["param"] == "input_ids", resp.text[:300]
        ok = httpx.post(url + "/generate", json=WELL_FORMED, timeout=60)
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 8, ok.text


# ---- slow readers ---------------------------------------------------------------------------


def _tree_rss_kib(pid: int) -> int:
    """Resident set of `pid` and all its descendants, in KiB (from /proc)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        with contextlib.suppress(FileNotFoundError, ProcessLookupError):
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
            for task in Path(f"/proc/{p}/task").iterdir():
                children = (task / "children").read_text().split()
                todo += [int(c) for c in children]
    return total


def _slow_reader(url: str, body: dict) -> socket.socket:
    """Send a streaming /generate on a socket with a tiny receive buffer and never read it."""
    host, port = url.removeprefix("http://").split(":")
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    payload = json.dumps({**body, "stream": True}).encode()
    head = (
        f"POST /generate HTTP/1.1\r\nHost: {host}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n\r\n"
    ).encode()
    sock.sendall(head + payload)
    return sock


STREAMS = 24  # per server; each asks for 240 tokens (the tiny context is 256)
SLOW_BODY = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 240,
             "ignore_eos": True, "temperature": 0}}  # fmt: skip
RSS_BOUND_KIB = 150 * 1024  # growth allowed for all the slow streams together


def test_many_sse_streams_on_slow_readers_hold_bounded_memory(
    engine: LiveServer, router: Router
) -> None:
    assert_kv_at_rest(engine.base_url)
    pids = {"engine": engine.proc.pid, "router": router.proc.pid}
    before = {k: _tree_rss_kib(p) for k, p in pids.items()}
    finished = metric(engine.base_url, "num_requests_total")
    socks = [_slow_reader(u, SLOW_BODY) for u in _urls(engine, router) for _ in range(STREAMS)]
    try:
        # Readers do not hold the engine back: every stream is generated in full (the
        # engine's own count of finished requests) while no client has read a byte and
        # every connection is still open. Nothing is left to queue a new request behind.
        wait_until(
            lambda: metric(engine.base_url, "num_requests_total") >= finished + len(socks),
            120,
            "every slow stream generated in full",
        )
        assert _cut(socks) == 0, "a server dropped slow readers"
        # A well-formed request is served as usual beside them: in full, never retracted,
        # with every slow stream still held open (not shed to make room).
        ok = httpx.post(router.url + "/generate", json=WELL_FORMED, timeout=60)
        assert ok.status_code == 200 and len(ok.json()["output_ids"]) == 8, ok.text
        assert ok.json()["meta_info"]["total_retractions"] == 0, ok.json()["meta_info"]
        assert _cut(socks) == 0, "a server dropped slow readers to serve a new request"
        during = {k: _tree_rss_kib(p) for k, p in pids.items()}
        print(f"slow readers: rss KiB before={before} during={during}")
        for k in pids:
            assert during[k] - before[k] < RSS_BOUND_KIB, (k, before[k], during[k])
    finally:
        for s in socks:
            s.close()
    assert_kv_at_rest(engine.base_url)


# ---- connection flood -----------------------------------------------------------------------

FLOOD = 300


def _cut(socks: list[socket.socket]) -> int:
    """How many of `socks` the server has closed."""
    return sum(_closed_by_peer(s) for s in socks)


def _fds(pid: int) -> int:
    return len(os.listdir(f"/proc/{pid}/fd"))


def _closed_by_peer(sock: socket.socket) -> bool:
    """The server closed it: EOF (or a reset) without a byte of an answer."""
    sock.settimeout(0)
    try:
        return sock.recv(1, socket.MSG_PEEK) == b""
    except BlockingIOError:
        return False
    except OSError:
        return True


@pytest.mark.parametrize("which", ["router", "engine"])
def test_connection_flood_is_survived_and_cut_without_an_fd_leak(
    which: str, engine: LiveServer, router: Router
) -> None:
    """Half the flood sends nothing, half stops in the middle of its headers (slowloris). The
    server answers beside them, closes every one of them once the header deadline passes
    (while the clients still hold them open), and is back to its file descriptors before."""
    url, pid = (
        (router.url, router.proc.pid) if which == "router" else (engine.base_url, engine.proc.pid)
    )
    assert httpx.get(url + "/health", timeout=10).status_code == 200
    baseline = _fds(pid)
    host, port = url.removeprefix("http://").split(":")
    socks = []
    try:
        for i in range(FLOOD):
            s = socket.create_connection((host, int(port)), timeout=10)
            if i % 2:
                s.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Le")
            socks.append(s)
        start = time.monotonic()
        assert httpx.get(url + "/health", timeout=30).status_code == 200
        ok = httpx.post(url + "/generate", json=WELL_FORMED, timeout=60)
        assert ok.status_code == 200, ok.text
        answered = time.monotonic() - start
        during = _fds(pid)
        # Every connection is closed by the server (one still in the listen backlog is
        # accepted later and then cut), and its fds are back where they were.
        wait_until(lambda: _cut(socks) == FLOOD, 10 * HEADER_TIMEOUT_S, "every connection cut")
        wait_until(lambda: _fds(pid) <= baseline + 2, 10, "the server's fds to come back")
        print(
            f"flood {which}: fds baseline={baseline} during={during} after={_fds(pid)} "
            f"cut={_cut(socks)}/{FLOOD} well-formed answered in {answered:.2f}s"
        )
    finally:
        for s in socks:
            s.close()
    assert _fds(pid) <= baseline + 2
