"""A real `radixserve serve` subprocess on a free 127.0.0.1 port, for HTTP-level tests."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import httpx

STARTUP_TIMEOUT_S = 300


# Ports this test process has handed out. A port is free when chosen but is bound only later
# (a replica binds its HTTP port after loading its model), and the OS may offer the same port
# again meanwhile: two replicas started together once got one port, and one exited with
# "address already in use".
_HANDED_OUT: set[int] = set()


def free_port() -> int:
    """A free 127.0.0.1 port not handed out before in this process."""
    for _ in range(200):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port
    raise RuntimeError("no free port not handed out already")


def free_port_pair() -> int:
    """A port P with P and P + 1 both free (a KV-event PUB port and its replay port)."""
    return free_port_run(2)


def free_port_run(n: int) -> int:
    """A port P with P .. P + n - 1 all free (DP rank r publishes on P + 2r, replays on the
    next port)."""
    for _ in range(200):
        port = free_port()
        rest = range(port + 1, port + n)
        if _HANDED_OUT.intersection(rest):
            continue
        try:
            with contextlib.ExitStack() as stack:
                for p in rest:
                    s = stack.enter_context(socket.socket())
                    s.bind(("127.0.0.1", p))
        except OSError:
            continue
        _HANDED_OUT.update(rest)
        return port
    raise RuntimeError(f"no run of {n} free ports")


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: str

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


@contextmanager
def live_server(
    *extra_args: str, log_dir: str = "/tmp", env: dict[str, str] | None = None
) -> Iterator[LiveServer]:
    """Start the server, wait for /health, yield it, then SIGINT and wait (SIGKILL after 20 s).

    `env` adds variables to the server's environment (e.g. TMPDIR, where its ipc:// sockets go).
    """
    port = free_port()
    log_path = os.path.join(log_dir, f"radixserve-test-{port}.log")
    # The console script, run outside the repo: `python -m` from the repo root would let the
    # top-level operator/ folder shadow the standard library's `operator`.
    exe = os.path.join(os.path.dirname(sys.executable), "radixserve")
    cmd = [exe, "serve", "--port", str(port), "--model-path", "smollm2-135m", *extra_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=log_dir,
            env={**os.environ, **(env or {})},
        )
    server = LiveServer(f"http://127.0.0.1:{port}", port, proc, log_path)
    try:
        _wait_healthy(server)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def _wait_healthy(server: LiveServer) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.proc.poll() is not None:
            raise RuntimeError(f"server exited during start-up:\n{server.log()[-3000:]}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log()[-3000:]}")
