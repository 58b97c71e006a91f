"""Process lifecycle of a live server: a full queue answers 503, a dying child takes the
server down with a clear log line, and Ctrl-C leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import httpx

from tests.engine.server.live_server import live_server


def _children(pid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if ppid == pid:
            out.append(int(entry))
    return out


def _cmdline(pid: int) -> bytes:
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        return f.read()


def _rss_kb(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


async def _burst(url: str, n: int) -> list[httpx.Response]:
    body = {
        "text": "Tell me a story.",
        "sampling_params": {"max_new_tokens": 32, "ignore_eos": True},
    }
    async with httpx.AsyncClient(timeout=300) as c:
        return await asyncio.gather(*(c.post(url + "/generate", json=body) for _ in range(n)))


def test_full_queue_503_then_child_death_and_clean_ctrl_c() -> None:
    args = (
        "--max-running-requests",
        "1",
        "--max-queued-requests",
        "1",
        "--max-total-tokens",
        "4096",
    )
    with live_server(*args) as srv:
        codes = [r.status_code for r in asyncio.run(_burst(srv.base_url, 6))]
        assert 200 in codes and 503 in codes, codes
        rejected = next(r for r in asyncio.run(_burst(srv.base_url, 6)) if r.status_code == 503)
        assert "queue is full" in rejected.json()["message"]
        kids = _children(srv.proc.pid)
        # Kill the scheduler (the spawned worker holding the model: the largest one).
        workers = [k for k in kids if b"spawn_main" in _cmdline(k)]
        scheduler = max(workers, key=_rss_kb)
        os.kill(scheduler, signal.SIGKILL)
        assert srv.proc.wait(30) != 0
        assert "child process died" in srv.log()
        time.sleep(1)
        assert not [k for k in kids if _alive(k) and k != scheduler], "orphaned children"


def test_api_key_and_ctrl_c_stops_every_process() -> None:
    with live_server("--max-total-tokens", "2048", "--api-key", "sekret") as srv:
        assert httpx.get(srv.base_url + "/health", timeout=10).status_code == 200
        assert httpx.get(srv.base_url + "/metrics", timeout=10).status_code == 200  # scrapes
        denied = httpx.get(srv.base_url + "/v1/models", timeout=10)
        assert denied.status_code == 401 and denied.json()["object"] == "error"
        ok = httpx.get(
            srv.base_url + "/v1/models", timeout=10, headers={"Authorization": "Bearer sekret"}
        )
        assert ok.status_code == 200
        kids = [k for k in _children(srv.proc.pid) if _alive(k)]
        assert kids
        srv.proc.send_signal(signal.SIGINT)
        assert srv.proc.wait(30) == 0
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_alive(k) for k in kids):
            time.sleep(0.2)
        assert not [k for k in kids if _alive(k)], "children survived Ctrl-C"
