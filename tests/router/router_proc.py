"""Real processes for the live router tests: `radixserve router` and engine replicas with KV
events, each a subprocess on free 127.0.0.1 ports, plus readers for the router's /metrics.

Engines run in their own session (process group) so a test can SIGKILL a replica with its
scheduler and detokenizer children at once, and with one CPU thread each: three replicas
share the machine's cores instead of fighting over them.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.child_env import child_env
from tests.ports import LostPort, free_port, free_port_pair, lost_its_port

EXE = os.path.join(os.path.dirname(sys.executable), "radixserve")
ENGINE_START_TIMEOUT_S = 300
ROUTER_START_TIMEOUT_S = 60
STOP_GRACE_S = 20
STARTS = 3  # tries at start-up, each on fresh ports, while a process loses a port to another


def _log_tail(path: str, n: int = 4000) -> str:
    with open(path, errors="replace") as f:
        return f.read()[-n:]


def _stop(proc: subprocess.Popen[bytes], group: bool) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(5)
    if group:  # children that outlived their parent (they should not)
        with suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


# ---- engine replicas ----------------------------------------------------------------------------


@dataclass(frozen=True)
class Engine:
    port: int
    kv_port: int
    proc: subprocess.Popen[bytes]
    log_path: str
    extra: tuple[str, ...] = ()  # its command line after the port flags
    ports_chosen: bool = True  # by start_engine: it may choose others if one is taken

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self) -> str:
        return _log_tail(self.log_path)

    def kill(self) -> None:
        """SIGKILL the whole replica (main process, scheduler, detokenizer): a crash."""
        with suppress(ProcessLookupError):
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        _stop(self.proc, group=True)


def start_engine(port: int | None = None, kv_port: int | None = None, *extra: str) -> Engine:
    """Start a SmolLM2 replica with KV events (not yet waited for: see `wait_engines`)."""
    chosen = port is None and kv_port is None
    port = port or free_port()
    kv_port = kv_port or free_port_pair()
    log_path = f"/tmp/radixserve-router-test-engine-{port}.log"
    cmd = [
        EXE, "serve", "--model-path", "smollm2-135m", "--host", "127.0.0.1",
        "--port", str(port), "--kv-events-port", str(kv_port),
        "--max-total-tokens", "32768", *extra,
    ]  # fmt: skip
    env = child_env({"OMP_NUM_THREADS": "1"})
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp", env=env, start_new_session=True
        )
    return Engine(port, kv_port, proc, log_path, tuple(extra), chosen)


def wait_engines(engines: list[Engine]) -> None:
    """Wait until every replica answers /health. One that lost a port to another process at
    start-up (between the choice and its bind) is started again on fresh ports, in its place
    in `engines`, if start_engine chose its ports."""
    deadline = time.monotonic() + ENGINE_START_TIMEOUT_S
    pending = list(engines)
    starts = dict.fromkeys(range(len(engines)), 1)
    while pending:
        for e in list(pending):
            if e.proc.poll() is not None:
                i = engines.index(e)
                if not _may_restart(e, starts[i]):
                    raise RuntimeError(f"engine {e.url} exited during start-up:\n{e.log_tail()}")
                e.stop()
                engines[i] = start_engine(None, None, *e.extra)
                starts[i] += 1
                pending[pending.index(e)] = engines[i]
                continue
            try:
                if httpx.get(e.url + "/health", timeout=2).status_code == 200:
                    pending.remove(e)
            except httpx.HTTPError:
                pass
        if pending and time.monotonic() > deadline:
            raise RuntimeError(f"engine {pending[0].url} not healthy:\n{pending[0].log_tail()}")
        if pending:
            time.sleep(0.2)


def _may_restart(engine: Engine, starts: int) -> bool:
    return engine.ports_chosen and starts < STARTS and lost_its_port(engine.log_tail())


# ---- the router ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Router:
    url: str
    proc: subprocess.Popen[bytes]
    log_path: str

    def log_tail(self) -> str:
        return _log_tail(self.log_path)

    def metrics(self) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
        resp = httpx.get(self.url + "/metrics", timeout=10)
        resp.raise_for_status()
        return parse_metrics(resp.text)

    def healthy_workers(self) -> int:
        resp = httpx.get(self.url + "/readiness", timeout=10)
        return int(resp.json().get("healthy_workers", 0)) if resp.status_code == 200 else 0


def parse_metrics(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """{(sample name, labels): value} of a Prometheus text exposition."""
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, frozenset(s.labels.items()))] = s.value
    return out


def by_worker(
    metrics: dict[tuple[str, frozenset[tuple[str, str]]], float], name: str
) -> dict[str, float]:
    """One sample name summed per `worker` label (over routes, outcomes, ranks, modes)."""
    out: dict[str, float] = {}
    for (sample, labels), value in metrics.items():
        worker = dict(labels).get("worker")
        if sample == name and worker is not None:
            out[worker] = out.get(worker, 0.0) + value
    return out


@contextmanager
def router_proc(
    worker_urls: Sequence[str], *args: str, healthy: int | None = None
) -> Iterator[Router]:
    """`radixserve router` in front of `worker_urls`, health checks every 0.5 s; waits for
    /health and, when `healthy` is given, for that many healthy workers. Stopped with SIGINT;
    the router's log is printed when the body fails (pytest shows it with the failure)."""
    for attempt in range(1, STARTS + 1):
        router = _start_router(worker_urls, args)
        try:
            _wait_router(router, healthy)
        except LostPort:  # another process took its port: again, on a fresh one
            _stop(router.proc, group=False)
            if attempt == STARTS:
                raise
            continue
        except BaseException:
            _stop(router.proc, group=False)
            raise
        try:
            yield router
        except BaseException:
            print(f"---- router log {router.log_path} (tail) ----\n{router.log_tail()}")
            raise
        finally:
            _stop(router.proc, group=False)
        return


def _start_router(worker_urls: Sequence[str], args: Sequence[str]) -> Router:
    port = free_port()
    log_path = f"/tmp/radixserve-router-test-{port}.log"
    cmd = [
        EXE, "router", "--port", str(port), "--health-check-interval-s", "0.5",
        *(["--worker-urls", *worker_urls] if worker_urls else []), *args,
    ]  # fmt: skip
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            cmd, stdout=log, stderr=subprocess.STDOUT, cwd="/tmp", env=child_env()
        )
    return Router(f"http://127.0.0.1:{port}", proc, log_path)


def _wait_router(router: Router, healthy: int | None) -> None:
    deadline = time.monotonic() + ROUTER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if router.proc.poll() is not None:
            if lost_its_port(router.log_tail()):
                raise LostPort(f"router lost its port to another process:\n{router.log_tail()}")
            raise RuntimeError(f"router exited during start-up:\n{router.log_tail()}")
        try:
            up = httpx.get(router.url + "/health", timeout=2).status_code == 200
            if up and (healthy is None or router.healthy_workers() >= healthy):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise RuntimeError(f"router not ready (healthy={healthy}):\n{router.log_tail()}")


class EngineSet:
    """Replicas shared by the live router tests. A test that kills one restarts it on the same
    ports; `revive` does that for a test that failed half-way, so later tests still get N."""

    def __init__(self, engines: list[Engine]) -> None:
        self.engines = engines

    @classmethod
    def start(cls, n: int) -> EngineSet:
        engines = [start_engine() for _ in range(n)]
        try:
            wait_engines(engines)
        except BaseException:
            for e in engines:
                e.stop()
            raise
        return cls(engines)

    def restart(self, i: int) -> Engine:
        """Start replica `i` again on its HTTP and KV ports (the old one must be gone)."""
        old = self.engines[i]
        old.stop()
        self.engines[i] = start_engine(old.port, old.kv_port)
        wait_engines([self.engines[i]])
        return self.engines[i]

    def revive(self) -> None:
        for i, e in enumerate(self.engines):
            if e.proc.poll() is not None:
                self.restart(i)

    def flush(self) -> None:
        """Empty every replica's cache (retried while a request of a previous test drains)."""
        for e in self.engines:
            deadline = time.monotonic() + 30
            while httpx.post(e.url + "/flush_cache", timeout=30).status_code != 200:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{e.url}: /flush_cache kept failing")
                time.sleep(0.2)

    def stop(self) -> None:
        for e in self.engines:
            e.stop()


# ---- requests -----------------------------------------------------------------------------------

VOCAB_SIZE = 49152  # SmolLM2; ids below 100 are left out (special tokens live there)


def random_ids(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, VOCAB_SIZE) for _ in range(n)]


def generate_body(
    ids: list[int], max_new_tokens: int = 1, stream: bool = False, ignore_eos: bool = False
) -> dict[str, Any]:
    params = {"max_new_tokens": max_new_tokens, "temperature": 0, "ignore_eos": ignore_eos}
    return {"input_ids": ids, "sampling_params": params, "stream": stream}


async def generate_all(
    url: str, prompts: Sequence[list[int]], concurrency: int, **params: Any
) -> list[dict[str, Any]]:
    """POST each prompt to `url`/generate in order, at most `concurrency` at a time; every
    answer must be a 200. Returns the JSON answers in prompt order."""
    limit = asyncio.Semaphore(concurrency)  # FIFO: requests start in prompt order
    async with httpx.AsyncClient(timeout=300) as client:

        async def one(ids: list[int]) -> dict[str, Any]:
            async with limit:
                resp = await client.post(url + "/generate", json=generate_body(ids, **params))
            assert resp.status_code == 200, resp.text
            return resp.json()

        return list(await asyncio.gather(*(one(p) for p in prompts)))


def wait_for(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(0.1)


def error_message(resp: httpx.Response, status: int) -> str:
    """The message of an error answer, checked against the documented shape (the engine's):
    `{"object": "error", "message", "type", "code"}` with the HTTP status as the code."""
    assert resp.status_code == status, (resp.status_code, resp.text)
    assert resp.headers["content-type"].startswith("application/json"), resp.headers
    body = resp.json()
    assert body["object"] == "error" and body["code"] == status and body["type"], body
    return str(body["message"])
