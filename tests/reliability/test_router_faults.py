"""Router faults with real processes: two tiny random-weight engine replicas with KV events,
shared by the tests of this file, and routers started per test.

- A router started next to warm replicas (a restart, or a second router replica beside the
  first) mirrors their caches from the replay before it routes: the first follow-ups it sends
  hit, as the engines' own `cached_tokens` prove, and the old router agrees on the placement.
- A replica that hangs (SIGSTOP: its sockets still accept, nothing answers) costs timeouts,
  then its circuit breaker opens and it turns unhealthy; every request is answered by the
  other replica; after SIGCONT it comes back.
"""

from __future__ import annotations

import os
import random
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.engine.models.tiny import VOCAB
from tests.reliability.conftest import save_tiny_checkpoint
from tests.router.router_proc import (
    Engine,
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
    params = {"max_new_tokens": 1, "temperature": 0}
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
        "--cb-timeout-s", "4",
    )  # fmt: skip
    with router_proc([e.url for e in replicas], *args, healthy=2) as router:
        os.killpg(hung.proc.pid, signal.SIGSTOP)
        try:
            took = []
            for _ in range(8):
                start = time.monotonic()
                out = _generate(router.url, [rng.randrange(2, VOCAB) for _ in range(PROMPT)])
                took.append(time.monotonic() - start)
                assert out["meta_info"]["finish_reason"]["type"] == "length"
            metrics = router.metrics()
            assert _sample(metrics, "radixserve_router_circuit_open", hung.url) == 1
            # Exactly the breaker's threshold of attempts went to the hung replica: after it
            # opened, nothing more did. Every request was answered by the live one.
            failed = _sample(
                metrics, "radixserve_router_requests_total", hung.url, outcome="transport_error"
            )
            assert failed == 2, failed
            ok = _sample(metrics, "radixserve_router_requests_total", live.url, outcome="200")
            assert ok == 8, ok
            assert max(took[-4:]) < 2, took  # once open, no request waits for a timeout
        finally:
            os.killpg(hung.proc.pid, signal.SIGCONT)
        # After --cb-timeout-s the breaker lets a probe through again (half-open).
        wait_for(
            lambda: _sample(router.metrics(), "radixserve_router_circuit_open", hung.url) == 0,
            30,
            "the breaker to half-open",
        )
        assert httpx.get(hung.url + "/health", timeout=30).status_code == 200
