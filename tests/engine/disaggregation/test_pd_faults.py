"""Faults of a prefill/decode pair, each ending in a clean error (never a hang) with every queue
and KV slot of the surviving side back at rest: the bootstrap and transfer timeouts, a decode
killed after it asked for the KV, a prefill killed after bootstrap. Timeouts and heartbeats are
shortened through SGLang's environment variables."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import pytest

from tests.engine.disaggregation.pd_servers import (
    COMMON,
    Pair,
    at_rest,
    bootstrap_fields,
    load,
    pd_pair,
)
from tests.engine.server.live_server import live_server
from tests.ports import free_port

pytestmark = pytest.mark.slow

ENV = {
    "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT": "4",
    "SGLANG_DISAGGREGATION_WAITING_TIMEOUT": "4",
    "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL": "1",
    # an aborted decode room keeps its pages this long for a write still under way (30 s)
    "SGLANG_DISAGGREGATION_DEFERRED_DECODE_KV_RELEASE_TIMEOUT": "4",
}
BODY = {"text": "A request that meets a fault", "sampling_params": {"max_new_tokens": 8}}


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with pd_pair(env=ENV) as p:
        yield p


def _wait(predicate: Any, what: str, limit_s: float = 120) -> None:
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached: {what}")
        time.sleep(0.5)


def _post(url: str, body: dict[str, Any]) -> httpx.Response:
    return httpx.post(url + "/generate", json=body, timeout=120)


def test_bootstrap_timeout_on_the_prefill(pair: Pair) -> None:
    r = _post(pair.prefill.base_url, {**BODY, **bootstrap_fields(pair)})
    assert r.status_code == 500
    assert "no decode server asked for bootstrap_room" in r.json()["message"]
    _wait(lambda: at_rest(pair.prefill), "prefill at rest")


def test_transfer_timeout_on_the_decode(pair: Pair) -> None:
    # the prefill holds the KVRequest but never gets the request: nothing is ever written
    r = _post(pair.decode.base_url, {**BODY, **bootstrap_fields(pair)})
    assert r.status_code == 500
    assert "timed out" in r.json()["message"]
    assert load(pair.decode)["kv_transfer_failed_total"] >= 1
    _wait(lambda: at_rest(pair.decode) and at_rest(pair.prefill), "both sides at rest")


def test_decode_killed_after_asking_for_the_kv(pair: Pair) -> None:
    args = (*COMMON, "--disaggregation-mode", "decode")
    with live_server(*args, env=ENV) as doomed:
        fields = bootstrap_fields(pair)
        with ThreadPoolExecutor(1) as pool:
            lost = pool.submit(_post, doomed.base_url, {**BODY, **fields})
            _wait(lambda: load(doomed)["num_decode_transfer_queue_reqs"] == 1, "in transfer")
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait(30)
            with pytest.raises(httpx.HTTPError):
                lost.result()
        # the prefill gets the request now: its write to the dead decode fails cleanly
        r = _post(pair.prefill.base_url, {**BODY, **fields})
    assert r.status_code == 500
    assert "failed" in r.json()["message"] or "acknowledge" in r.json()["message"]
    _wait(lambda: at_rest(pair.prefill), "prefill at rest")


def test_prefill_killed_after_bootstrap(pair: Pair) -> None:
    port = free_port()  # the pair's own prefill stays up: a doomed one of its own
    args = (*COMMON, "--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port")
    with live_server(*args, str(port), env=ENV) as doomed:
        fields = {**bootstrap_fields(pair), "bootstrap_port": port}
        with ThreadPoolExecutor(1) as pool:
            waiting = pool.submit(_post, pair.decode.base_url, {**BODY, **fields})
            _wait(lambda: load(pair.decode)["num_decode_transfer_queue_reqs"] == 1, "in transfer")
            doomed.proc.send_signal(signal.SIGKILL)
            doomed.proc.wait(30)
            r = waiting.result()
    assert r.status_code == 500
    message = r.json()["message"]
    assert "stopped answering" in message or "timed out" in message
    _wait(lambda: at_rest(pair.decode), "decode at rest")
