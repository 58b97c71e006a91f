"""A real `radixserve serve` subprocess on a free 127.0.0.1 port, for HTTP-level tests."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass

import httpx

from tests.child_env import child_env
from tests.ports import LostPort, free_port, free_port_run, lost_its_port

STARTUP_TIMEOUT_S = 300
STARTS = 3  # tries at start-up, each on fresh ports, while the server loses a port to another


@dataclass(frozen=True)
class LiveServer:
    base_url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: str
    kv_port: int | None = None  # its KV-event PUB port (replays on the next), when it has one

    def log(self) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()


@contextmanager
def live_server(
    *extra_args: str,
    log_dir: str = "/tmp",
    env: dict[str, str] | None = None,
    kv_ports: int = 0,
    model_path: str = "smollm2-135m",
) -> Iterator[LiveServer]:
    """Start the server, wait for /health, yield it, then SIGINT and wait (SIGKILL after 20 s).

    `env` adds variables to the server's environment (e.g. TMPDIR, where its ipc:// sockets go).
    `model_path` is the server's --model-path (an alias, or a checkpoint folder: an absolute
    path, as the server runs in `log_dir`). `kv_ports` > 0 turns KV events on, on a run of that
    many ports (2 per DP rank). Every port the server binds is chosen here, so a server that
    finds one taken by another process (between the choice and its bind, after loading its
    model) is started again on fresh ones.
    """
    for attempt in range(1, STARTS + 1):
        server = _start(extra_args, log_dir, env, kv_ports, model_path)
        try:
            _wait_healthy(server)
        except LostPort:
            _stop(server.proc)
            if attempt == STARTS:
                raise
            continue
        except BaseException:
            _stop(server.proc)
            raise
        try:
            yield server
        finally:
            _stop(server.proc)
        return


def _start(
    extra_args: tuple[str, ...],
    log_dir: str,
    env: dict[str, str] | None,
    kv_ports: int,
    model_path: str,
) -> LiveServer:
    port = free_port()
    kv_port = free_port_run(kv_ports) if kv_ports else None
    kv_args = ("--kv-events-port", str(kv_port)) if kv_port is not None else ()
    log_path = os.path.join(log_dir, f"radixserve-test-{port}.log")
    # The console script, run outside the repo: `python -m` from the repo root would let the
    # top-level operator/ folder shadow the standard library's `operator`.
    exe = os.path.join(os.path.dirname(sys.executable), "radixserve")
    cmd = [exe, "serve", "--port", str(port), "--model-path", model_path]
    cmd += [*kv_args, *extra_args]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=log_dir,
            env=child_env(env),
        )
    return LiveServer(f"http://127.0.0.1:{port}", port, proc, log_path, kv_port)


def _stop(proc: subprocess.Popen[bytes]) -> None:
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
            log = server.log()
            if lost_its_port(log):
                raise LostPort(f"server lost a port to another process:\n{log[-3000:]}")
            raise RuntimeError(f"server exited during start-up:\n{log[-3000:]}")
        try:
            if httpx.get(server.base_url + "/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)  # a refused connection is cheap; a second per try was idle time
    raise RuntimeError(f"server not healthy after {STARTUP_TIMEOUT_S}s:\n{server.log()[-3000:]}")


@contextmanager
def started_together(
    *starts: Callable[[], AbstractContextManager[LiveServer]],
) -> Iterator[list[LiveServer]]:
    """Several servers (each a `lambda: live_server(...)`) whose start-ups overlap, as a PD
    pair's two sides; all are stopped when one fails to start, and together at the end."""
    stacks = [ExitStack() for _ in starts]
    with ThreadPoolExecutor(len(starts)) as pool:
        futures = [
            pool.submit(st.enter_context, start()) for st, start in zip(stacks, starts, strict=True)
        ]
        errors = [f.exception() for f in futures]
    try:
        for error in errors:
            if error is not None:
                raise error
        yield [f.result() for f in futures]
    finally:
        for st in reversed(stacks):
            st.close()
