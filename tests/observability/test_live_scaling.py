"""Scaling a local stack 2 → 3 → 2 while traffic runs, the way a user does it without
Kubernetes: a router with `--admin-key` in front of two SmolLM2 replicas, a third replica
registered with `POST /workers`, then one of the first two taken out with `DELETE /workers`
and stopped once its last request finished. Clients keep sending requests throughout; every
one of them must succeed, the new replica must get traffic, and the removed one none after
its removal. (On Kubernetes the same router follows the Service's EndpointSlices instead:
tests/router/test_k8s_discovery*.py.)

The third replica is started together with the first two (start-up is the slow part on a CPU
box); it joins the router only in the middle of the traffic.
"""

from __future__ import annotations

import asyncio
import random
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx
import pytest

from tests.router.router_proc import (
    EngineSet,
    Router,
    by_worker,
    generate_body,
    random_ids,
    router_proc,
    wait_for,
)

pytestmark = [pytest.mark.slow, pytest.mark.timeout(900)]

ADMIN = {"Authorization": "Bearer scale-test-admin"}
ROUTED = "radixserve_router_requests_total"


@dataclass
class Traffic:
    """Clients that keep sending short /generate requests through the router until stopped."""

    url: str
    concurrency: int = 3
    statuses: Counter[int | str] = field(default_factory=Counter)
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        asyncio.run(self._main())

    async def _main(self) -> None:
        async with httpx.AsyncClient(timeout=120) as client:
            await asyncio.gather(*(self._client(client, i) for i in range(self.concurrency)))

    async def _client(self, client: httpx.AsyncClient, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            body = generate_body(random_ids(rng, 12), max_new_tokens=4, ignore_eos=True)
            try:
                resp = await client.post(self.url + "/generate", json=body)
                self.statuses[resp.status_code] += 1
            except httpx.HTTPError as exc:
                self.statuses[type(exc).__name__] += 1

    def done(self) -> int:
        return sum(self.statuses.values())


@pytest.fixture(scope="module")
def engines() -> Iterator[EngineSet]:
    engines = EngineSet.start(3)
    try:
        yield engines
    finally:
        engines.stop()


def routed(router: Router) -> dict[str, float]:
    return by_worker(router.metrics(), ROUTED)


def wait_requests(traffic: Traffic, more: int) -> None:
    target = traffic.done() + more
    wait_for(lambda: traffic.done() >= target, 300, f"{more} more requests")


def test_scale_out_and_in_with_traffic_and_no_failed_request(engines: EngineSet) -> None:
    first, second, third = engines.engines
    with router_proc([first.url, second.url], "--admin-key", ADMIN["Authorization"][7:]) as router:
        wait_for(lambda: router.healthy_workers() == 2, 60, "two healthy workers")
        traffic = Traffic(router.url)
        thread = threading.Thread(target=traffic.run, daemon=True)
        thread.start()
        try:
            wait_requests(traffic, 6)
            # scale out: 2 → 3
            resp = httpx.post(router.url + "/workers", json={"url": third.url}, headers=ADMIN)
            assert resp.status_code == 201, resp.text
            wait_for(lambda: routed(router).get(third.url, 0) >= 3, 300, "traffic on the third")
            # scale in: 3 → 2, draining the removed replica before stopping it
            resp = httpx.delete(router.url + "/workers", params={"url": first.url}, headers=ADMIN)
            assert resp.status_code == 200, resp.text
            wait_for(lambda: _idle(first.url), 120, "the removed replica to drain")
            first.stop()
            at_removal = routed(router).get(first.url, 0)
            wait_requests(traffic, 9)
        finally:
            traffic.stop.set()
            thread.join(180)
        after = routed(router)
    assert not thread.is_alive()
    assert set(traffic.statuses) == {200}, traffic.statuses  # not one failed request
    assert after.get(third.url, 0) >= 3
    assert after.get(first.url, 0) == at_removal  # nothing routed to it once removed
    assert after.get(second.url, 0) > 0


def _idle(url: str) -> bool:
    """No request queued or running, twice half a second apart (one may be in transit)."""
    for _ in range(2):
        load = httpx.get(url + "/get_load", timeout=10).json()
        if any(item["num_reqs"] for item in (load if isinstance(load, list) else [load])):
            return False
        time.sleep(0.5)
    return True
