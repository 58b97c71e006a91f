"""Router faults with real processes: two tiny random-weight engine replicas with KV events,
shared by the tests of this file, and routers started per test.

- A router started next to warm replicas (a restart, or a second router replica beside the
  first) mirrors their caches from the replay before it routes: the first follow-ups it sends
  hit, as the engines' own `cached_tokens` prove, and the old router agrees on the placement.
- A replica's KV-event stream cut while its HTTP keeps working: the router matches that
  replica on the prompts routed to it meanwhile, then returns to its events, caught up by
  the replay.
- A replica that hangs (SIGSTOP: its sockets still accept, nothing answers) costs timeouts,
  then its circuit breaker opens and it turns unhealthy; every request is answered by the
  other replica; after SIGCONT it comes back.
"""

from __future__ import annotations

import contextlib
import os
import random
import signal
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.models.tiny import VOCAB
from tests.reliability.conftest import save_tiny_checkpoint
from tests.router.router_proc import (
    Engine,
    Router,
    by_worker,
    router_proc,
    start_engine,
    wait_engines,
    wait_for,
)

PROMPT, SUFFIX = 120, 20  # tokens; the tiny model's context is 256


@pytest.fixture(scope="module")
def replicas(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[Engine]]:
    folder: Path = save_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"))
    args = ("--model-path", str(folder), "--max-total-tokens", "8192")
    engines = [start_engine(None, None, *args) for _ in range(2)]
    try:
        wait_engines(engines)
        yield engines
    finally:
        for e in engines:
            e.stop()


def _flush(engines: list[Engine]) -> None:
    for e in engines:
        wait_for(
            lambda e=e: httpx.post(e.url + "/flush_cache", timeout=30).status_code == 200,
            30,
            f"{e.url} to flush",
        )


def _generate(url: str, prompt: list[int], timeout: float = 60) -> dict:
    params = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}
    resp = httpx.post(
        url + "/generate", json={"input_ids": prompt, "sampling_params": params}, timeout=timeout
    )
    assert resp.status_code == 200, resp.text
    out: dict = resp.json()
    return out


def test_new_router_next_to_warm_replicas_hits_their_caches_and_agrees(
    replicas: list[Engine],
) -> None:
    _flush(replicas)
    rng = random.Random(11)
    prompts = [[rng.randrange(2, VOCAB) for _ in range(PROMPT)] for _ in range(6)]
    urls = [e.url for e in replicas]
    with router_proc(urls, healthy=2) as first:
        for p in prompts:  # each prompt lands on exactly one replica
            assert _generate(first.url, p)["meta_info"]["cached_tokens"] == 0
        placed = by_worker(first.metrics(), "radixserve_router_requests_total")
        assert sum(placed.values()) == len(prompts)
        with router_proc(urls, healthy=2) as second:
            # The second router has never routed anything: only the replay tells it where
            # each prompt is. Its first requests, sent the moment it is ready, must hit; the
            # first router, asked the same, must pick the same replica (the only one holding
            # the prompt, so a hit through both routers is agreement).
            for i, p in enumerate(prompts):
                for via in (second, first):
                    follow = p + [rng.randrange(2, VOCAB) for _ in range(SUFFIX)]
                    cached = _generate(via.url, follow)["meta_info"]["cached_tokens"]
                    assert cached >= PROMPT, (i, via.url, cached)
            # And it knew at routing time (its mirror, not luck: with no mirror, a router
            # sends a prompt with no match to the emptier replica, which can be right).
            metrics = second.metrics()
            assert sum(by_worker(metrics, "radixserve_router_requests_total").values()) == 6
            known = sum(by_worker(metrics, "radixserve_router_cached_tokens_total").values())
            assert known >= len(prompts) * PROMPT, known


def _sample(metrics: dict, name: str, worker: str, **labels: str) -> float:
    want = {("worker", worker), *labels.items()}
    return sum(v for (s, lab), v in metrics.items() if s == name and want <= set(lab))


# Open long enough for AFTER_OPEN requests on a loaded machine: a half-open probe sent to the
# hung replica in between would (rightly) wait for the timeout.
CB_TIMEOUT_S = 10
AFTER_OPEN = 4


def _generate_length(url: str, rng: random.Random) -> None:
    out = _generate(url, [rng.randrange(2, VOCAB) for _ in range(PROMPT)])
    assert out["meta_info"]["finish_reason"]["type"] == "length", out


def _attempts(metrics: dict, worker: str) -> float:
    """Attempts the router sent to `worker`, whatever their outcome."""
    return _sample(metrics, "radixserve_router_requests_total", worker)


def _ok(metrics: dict, worker: str) -> float:
    return _sample(metrics, "radixserve_router_requests_total", worker, outcome="200")


def _retries(metrics: dict) -> float:
    return sum(v for (name, _), v in metrics.items() if name == "radixserve_router_retries_total")


def test_hanging_replica_times_out_opens_its_breaker_and_requests_go_elsewhere(
    replicas: list[Engine],
) -> None:
    """Health checks are told to be lenient here (1,000 failures), so what protects clients
    is the request timeout and the circuit breaker alone."""
    _flush(replicas)
    live, hung = replicas
    rng = random.Random(12)
    args = (
        "--request-timeout-s", "2", "--health-check-timeout-s", "1",
        "--health-failure-threshold", "1000", "--cb-failure-threshold", "2",
        "--cb-timeout-s", str(CB_TIMEOUT_S),
    )  # fmt: skip
    with router_proc([e.url for e in replicas], *args, healthy=2) as router:
        os.killpg(hung.proc.pid, signal.SIGSTOP)
        try:
            # Until the breaker opens, a request that meets the hung replica waits for the
            # timeout and is retried on the live one.
            sent = 0
            while not _sample(router.metrics(), "radixserve_router_circuit_open", hung.url):
                assert sent < 8, "the breaker never opened"
                _generate_length(router.url, rng)
                sent += 1
            # Once open, no request goes to the hung replica, so none waits for a timeout:
            # not one attempt there, no retry, each answered by the live one.
            before = router.metrics()
            for _ in range(AFTER_OPEN):
                _generate_length(router.url, rng)
            after = router.metrics()
            assert _attempts(after, hung.url) == _attempts(before, hung.url), "sent to hung"
            assert _retries(after) == _retries(before), (_retries(before), _retries(after))
            assert _ok(after, live.url) - _ok(before, live.url) == AFTER_OPEN
            assert _sample(after, "radixserve_router_circuit_open", hung.url) == 1
            # Exactly the breaker's threshold of attempts went to the hung replica; every
            # request was answered by the live one.
            failed = _sample(
                after, "radixserve_router_requests_total", hung.url, outcome="transport_error"
            )
            assert failed == 2, failed
            assert _ok(after, live.url) == sent + AFTER_OPEN
        finally:
            os.killpg(hung.proc.pid, signal.SIGCONT)
        # After --cb-timeout-s the breaker lets a probe through again (half-open).
        wait_for(
            lambda: _sample(router.metrics(), "radixserve_router_circuit_open", hung.url) == 0,
            30,
            "the breaker to half-open",
        )
        assert httpx.get(hung.url + "/health", timeout=30).status_code == 200


# ---- a KV-event stream cut while HTTP keeps working -------------------------------------------


class Relay:
    """A TCP relay the router dials instead of one replica's KV-event PUB port: `cut()` drops
    its connections and closes every new one at once (the port still accepts, as a broken
    network path might), `restore()` forwards again."""

    def __init__(self, target_port: int) -> None:
        self.target = target_port
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.open = True
        self.conns: list[socket.socket] = []
        self.lock = threading.Lock()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            if not self.open:
                client.close()
                continue
            upstream = socket.create_connection(("127.0.0.1", self.target))
            with self.lock:
                self.conns += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pump, args=(a, b), daemon=True).start()

    @staticmethod
    def _pump(src: socket.socket, dst: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := src.recv(65536):
                dst.sendall(data)
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        self.open = False
        with self.lock:
            for s in self.conns:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
            self.conns.clear()

    def restore(self) -> None:
        self.open = True

    def close(self) -> None:
        self.cut()
        self.listener.close()


ADMIN = "reliability-admin-key"


def _mode(router: Router, worker: str) -> str | None:
    for (name, labels), _ in router.metrics().items():
        lab = dict(labels)
        if name == "radixserve_router_mirror_tokens" and lab.get("worker") == worker:
            return lab["mode"]
    return None


def _known(router: Router) -> float:
    return sum(by_worker(router.metrics(), "radixserve_router_cached_tokens_total").values())


def _routed_to(router: Router, url: str, prompt: list[int]) -> tuple[str, dict]:
    """Send `prompt` through the router; which worker took it (by the router's counters)."""
    before = by_worker(router.metrics(), "radixserve_router_requests_total")
    out = _generate(url, prompt)
    after = by_worker(router.metrics(), "radixserve_router_requests_total")
    (worker,) = [w for w in after if after[w] != before.get(w, 0)]
    return worker, out


def test_kv_event_stream_cut_falls_back_to_the_approximate_view_and_returns(
    replicas: list[Engine],
) -> None:
    """The router follows replica 0's events through a relay. While the relay is cut (HTTP
    untouched), replica 0's target is matched on the prompts routed to it ("approx"); a new
    prompt routed there meanwhile is found for its follow-up. Once the relay forwards again,
    the target is back on events, and the batches published while it was cut came from the
    replay: the next follow-up is known from the mirror at routing time."""
    _flush(replicas)
    cut_one, other = replicas
    relay = Relay(cut_one.kv_port)
    rng = random.Random(13)
    try:
        with router_proc([], "--admin-key", ADMIN) as router:
            auth = {"Authorization": f"Bearer {ADMIN}"}
            kv = [{"endpoint": f"tcp://127.0.0.1:{relay.port}",
                   "replay_endpoint": f"tcp://127.0.0.1:{cut_one.kv_port + 1}"}]  # fmt: skip
            for body in ({"url": cut_one.url, "kv_events": kv}, {"url": other.url}):
                resp = httpx.post(router.url + "/workers", json=body, headers=auth, timeout=60)
                assert resp.status_code == 201, resp.text
            wait_for(lambda: _mode(router, cut_one.url) == "events", 30, "events mode")

            relay.cut()
            wait_for(lambda: _mode(router, cut_one.url) == "approx", 30, "the fallback")
            for _ in range(8):  # a prompt of our own on the cut replica
                prompt = [rng.randrange(2, VOCAB) for _ in range(PROMPT)]
                worker, _ = _routed_to(router, router.url, prompt)
                if worker == cut_one.url:
                    break
            else:
                raise AssertionError("no prompt was routed to the cut replica")
            before = _known(router)
            follow = prompt + [rng.randrange(2, VOCAB) for _ in range(SUFFIX)]
            worker, out = _routed_to(router, router.url, follow)
            assert worker == cut_one.url and out["meta_info"]["cached_tokens"] >= PROMPT
            assert _known(router) - before >= PROMPT, "the fallback did not know the prompt"
            assert _mode(router, cut_one.url) == "approx"

            relay.restore()
            wait_for(lambda: _mode(router, cut_one.url) == "events", 30, "events again")
            before = _known(router)
            follow = prompt + [rng.randrange(2, VOCAB) for _ in range(SUFFIX)]
            worker, out = _routed_to(router, router.url, follow)
            assert worker == cut_one.url and out["meta_info"]["cached_tokens"] >= PROMPT
            assert _known(router) - before >= PROMPT, "the mirror missed the batches of the cut"
    finally:
        relay.close()
