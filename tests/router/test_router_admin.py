"""The router's worker admin API against live replicas: closed without `--admin-key`, a 401
for a missing or wrong key, a 400 for an unreachable, duplicate or malformed worker, and a
worker added at run time receives traffic (by the engine's own request counter) until it is
removed, with its mirror; a flush through the router empties every replica and mirror.
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import httpx

from tests.ports import free_port
from tests.router.router_proc import (
    Engine,
    Router,
    by_worker,
    error_message,
    generate_all,
    parse_metrics,
    random_ids,
    router_proc,
    wait_for,
)

KEY = "admin-test-key"
AUTH = {"authorization": f"Bearer {KEY}"}
REQUESTS = "radixserve_router_requests_total"
MIRROR_TOKENS = "radixserve_router_mirror_tokens"


def engine_finished(engine: Engine) -> float:
    """Finished requests by the engine's own counter."""
    metrics = parse_metrics(httpx.get(engine.url + "/metrics", timeout=10).text)
    return sum(v for (name, _), v in metrics.items() if name == "radixserve:num_requests_total")


def listed(router: Router) -> dict[str, bool]:
    resp = httpx.get(router.url + "/workers", headers=AUTH, timeout=10)
    assert resp.status_code == 200, resp.text
    return {w["url"]: w["healthy"] for w in resp.json()["workers"]}


def send(router: Router, n: int, seed: int) -> dict[str, float]:
    """n requests one after the other; returns the router's per-replica request counts."""
    rng = random.Random(seed)
    asyncio.run(generate_all(router.url, [random_ids(rng, 32) for _ in range(n)], concurrency=1))
    return by_worker(router.metrics(), REQUESTS)


def post_worker(router: Router, headers: dict[str, str] = AUTH, **kw: Any) -> httpx.Response:
    return httpx.post(router.url + "/workers", headers=headers, timeout=30, **kw)


def test_admin_api_is_closed_without_an_admin_key() -> None:
    with router_proc([]) as router:
        calls = [
            ("GET", {}),
            ("POST", {"json": {"url": "http://127.0.0.1:1"}}),
            ("DELETE", {"params": {"url": "http://127.0.0.1:1"}}),
        ]
        for method, kw in calls:
            resp = httpx.request(
                method, router.url + "/workers", headers={"authorization": "Bearer x"}, **kw
            )
            assert "--admin-key" in error_message(resp, 401), method


def test_admin_api_rejects_bad_keys_and_bad_workers(engines: list[Engine]) -> None:
    a = engines[0]
    with router_proc([a.url], "--admin-key", KEY, healthy=1) as router:
        for headers in ({}, {"authorization": "Bearer wrong"}, {"authorization": KEY}):
            resp = httpx.get(router.url + "/workers", headers=headers, timeout=10)
            assert error_message(resp, 401) == "invalid or missing admin key", headers
        assert post_worker(router, headers={}, json={"url": engines[1].url}).status_code == 401

        dead = f"http://127.0.0.1:{free_port()}"
        resp = post_worker(router, json={"url": dead})
        assert dead in error_message(resp, 400)
        for url in (a.url, a.url + "/"):  # the same worker, however spelled
            resp = post_worker(router, json={"url": url})
            assert "already registered" in error_message(resp, 400)
        for kw in ({"content": b'{"url": '}, {"json": {"uri": a.url}}, {"json": [a.url]}):
            resp = post_worker(router, **kw)
            assert error_message(resp, 400).startswith(("body:", "url:")), kw
        assert listed(router) == {a.url: True}  # nothing was added by a failed call
        resp = httpx.delete(router.url + "/workers", params={"url": dead}, headers=AUTH)
        assert error_message(resp, 404).startswith("url:")


def test_a_worker_added_at_run_time_gets_traffic_until_removed(engines: list[Engine]) -> None:
    a, b = engines[0], engines[1]
    flags = ["--admin-key", KEY, "--policy", "round_robin"]
    with router_proc([a.url], *flags, healthy=1) as router:
        resp = post_worker(router, json={"url": b.url})
        assert resp.status_code == 201, resp.text
        assert resp.json()["url"] == b.url and resp.json()["healthy"] is True
        assert listed(router) == {a.url: True, b.url: True}
        # each worker's KV pool, per DP rank, is what the engine's /server_info says
        workers = httpx.get(router.url + "/workers", headers=AUTH, timeout=10).json()["workers"]
        for w in workers:
            info = httpx.get(w["url"] + "/server_info", timeout=10).json()
            pools = [r["max_total_num_tokens"] for r in info["dp_ranks"]]
            assert w["max_total_tokens"] == pools and pools[0] > 0, w

        b_before = engine_finished(b)
        assert send(router, 6, seed=1) == {a.url: 3, b.url: 3}  # round-robin over both
        assert engine_finished(b) - b_before == 3  # the engine saw them
        # The added worker's KV events feed its mirror.
        wait_for(lambda: by_worker(router.metrics(), MIRROR_TOKENS).get(b.url, 0) >= 96, 10, "b")

        # A flush through the router empties every replica, and the mirrors follow.
        assert httpx.post(router.url + "/flush_cache", timeout=30).status_code == 401
        resp = httpx.post(router.url + "/flush_cache", headers=AUTH, timeout=30)
        assert resp.status_code == 200, resp.text
        assert resp.json() == {"success": True, "workers": {a.url: 200, b.url: 200}}
        empty = {a.url: 0.0, b.url: 0.0}
        wait_for(lambda: by_worker(router.metrics(), MIRROR_TOKENS) == empty, 10, "mirrors empty")

        resp = httpx.delete(router.url + "/workers", params={"url": b.url}, headers=AUTH)
        assert resp.status_code == 200 and resp.json() == {"removed": b.url}
        assert listed(router) == {a.url: True}
        assert b.url not in by_worker(router.metrics(), MIRROR_TOKENS)
        b_before = engine_finished(b)
        assert send(router, 3, seed=2) == {a.url: 6, b.url: 3}  # nothing more to b
        assert engine_finished(b) == b_before
        resp = httpx.delete(router.url + "/workers", params={"url": b.url}, headers=AUTH)
        assert resp.status_code == 404  # already gone
