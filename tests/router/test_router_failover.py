"""A replica killed mid-run behind the router (issue 5, "What it must show" 3): the streams it
was serving end with one clean SSE error event, every request started afterwards succeeds (on
the survivors, the victim's cached prefix included), its mirror is dropped, and when a replica
comes back on the same ports the router follows it again: healthy, its mirror rebuilt from the
new engine's KV events and used for routing.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from typing import Any

import httpx

from tests.router.router_proc import (
    Engine,
    EngineSet,
    Router,
    by_worker,
    generate_all,
    generate_body,
    random_ids,
    router_proc,
    wait_for,
)

VICTIM = 2  # index in the shared replicas; the test restarts it on the same ports
PREFIX_LEN = 300
KEY = "failover-admin-key"
AUTH = {"authorization": f"Bearer {KEY}"}
MIRROR_TOKENS = "radixserve_router_mirror_tokens"
REQUESTS = "radixserve_router_requests_total"


async def read_stream(
    client: httpx.AsyncClient, url: str, ids: list[int], started: asyncio.Event | None = None
) -> list[str]:
    """The `data:` payloads of one streamed /generate through the router, to the end."""
    body = generate_body(ids, max_new_tokens=2000, stream=True, ignore_eos=True)
    if started is None:  # a stream meant to finish
        body["sampling_params"]["max_new_tokens"] = 4
    out = []
    async with client.stream("POST", url + "/generate", json=body) as resp:
        assert resp.status_code == 200, await resp.aread()
        async for line in resp.aiter_lines():
            if line.startswith("data:"):
                out.append(line[len("data:") :].strip())
                if started is not None:
                    started.set()
    return out


def workers(router: Router) -> dict[str, dict[str, Any]]:
    resp = httpx.get(router.url + "/workers", headers=AUTH, timeout=10)
    assert resp.status_code == 200, resp.text
    return {w["url"]: w for w in resp.json()["workers"]}


async def after_the_kill(router: Router, prompts: list[list[int]]) -> list[list[str]]:
    """Requests started once the victim is dead: half plain (each must be a 200 with its
    tokens), half streamed; returns the streams' payloads."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        plain = generate_all(router.url, prompts[::2], concurrency=3, max_new_tokens=2)
        streams = [read_stream(client, router.url, ids) for ids in prompts[1::2]]
        answers, *streamed = await asyncio.gather(plain, *streams)
    assert all(len(a["output_ids"]) == 2 for a in answers), answers
    return list(streamed)


async def kill_mid_stream(
    router: Router, victim: Engine, running: list[list[int]], after: list[list[int]]
) -> tuple[list[list[str]], float, list[list[str]]]:
    """Start streams that run on the victim, SIGKILL it once each has sent a token, and at once
    send `after` (racing the router's discovery of the death). Returns the killed streams'
    payloads, how long they took to end after the kill, and the later streams' payloads."""
    async with httpx.AsyncClient(timeout=httpx.Timeout(60.0)) as client:
        started = [asyncio.Event() for _ in running]
        tasks = [
            asyncio.create_task(read_stream(client, router.url, ids, ev))
            for ids, ev in zip(running, started, strict=True)
        ]
        await asyncio.wait_for(asyncio.gather(*(e.wait() for e in started)), 60)
        in_flight = (await asyncio.to_thread(workers, router))[victim.url]["load"]["0"]
        assert in_flight["in_flight"] == len(running), in_flight  # all on the victim
        await asyncio.to_thread(victim.kill)
        killed = time.monotonic()
        later = asyncio.create_task(after_the_kill(router, after))
        streams = await asyncio.wait_for(asyncio.gather(*tasks), 30)  # no hang
        ended_s = time.monotonic() - killed
        return list(streams), ended_s, await asyncio.wait_for(later, 60)


def mirror_of(router: Router, url: str) -> float | None:
    return by_worker(router.metrics(), MIRROR_TOKENS).get(url)


def engine_cache_tokens(engine: Engine) -> int:
    resp = httpx.get(engine.url + "/debug/cache_pages", timeout=10)
    return len(resp.json()["page_hashes"])


def test_a_replica_killed_mid_run_is_routed_around_and_followed_again(
    engines: list[Engine], kv_engines: EngineSet
) -> None:
    victim = engines[VICTIM]
    rng = random.Random(3)
    prefix = random_ids(rng, PREFIX_LEN)
    urls = [e.url for e in engines]
    # A second router that learns of the death only by trying: no stream breaks on it, and
    # its health checks are an hour apart.
    blind_args = ("--policy", "round_robin", "--health-check-interval-s", "3600")
    with (
        router_proc(urls, "--admin-key", KEY, healthy=len(engines)) as router,
        router_proc(urls, *blind_args, healthy=len(engines)) as blind,
    ):
        # The victim holds the tenant's prefix (sent to it directly); the router sees that.
        warm = httpx.post(victim.url + "/generate", json=generate_body(prefix + [7000]), timeout=60)
        assert warm.status_code == 200
        wait_for(lambda: (mirror_of(router, victim.url) or 0) >= PREFIX_LEN, 10, "victim mirror")

        running = [prefix + random_ids(rng, 8) for _ in range(3)]
        # Started after the kill, the victim's prefix among them: none may fail.
        after = [prefix + random_ids(rng, 8) if i % 2 else random_ids(rng, 64) for i in range(10)]
        streams, ended_s, later = asyncio.run(kill_mid_stream(router, victim, running, after))
        retries = router.metrics()[("radixserve_router_retries_total", frozenset())]
        print(f"streams ended {ended_s:.2f}s after the kill; {retries:.0f} retries")
        for payloads in streams:
            assert payloads[-1] == "[DONE]", payloads[-3:]
            error = json.loads(payloads[-2])["error"]
            assert victim.url in error["message"] and error["code"] == 502, error
            tokens = [json.loads(p) for p in payloads[:-2]]
            assert tokens and all("error" not in t for t in tokens)  # it had been streaming

        for payloads in later:
            assert payloads[-1] == "[DONE]" and not any('"error"' in p for p in payloads)
            assert len(payloads) >= 2

        # The blind router's round robin reaches the dead replica: refused before any byte
        # went out, so the request is retried on a live one and the victim marked unhealthy.
        answers = asyncio.run(generate_all(blind.url, [random_ids(rng, 16) for _ in range(6)], 1))
        assert len(answers) == 6
        assert blind.metrics()[("radixserve_router_retries_total", frozenset())] >= 1
        assert by_worker(blind.metrics(), "radixserve_router_worker_healthy")[victim.url] == 0

        wait_for(lambda: not workers(router)[victim.url]["healthy"], 10, "victim unhealthy")
        assert mirror_of(router, victim.url) is None  # its mirror is dropped
        assert all(mirror_of(router, e.url) is not None for e in engines if e is not victim)
        healthy_gauge = by_worker(router.metrics(), "radixserve_router_worker_healthy")
        assert healthy_gauge[victim.url] == 0

        revived = kv_engines.restart(VICTIM)  # same HTTP and KV-event ports
        wait_for(lambda: workers(router)[victim.url]["healthy"], 20, "victim healthy again")
        # The new engine's events rebuild the mirror: exactly what the engine caches.
        fresh = random_ids(rng, PREFIX_LEN)
        warm = httpx.post(revived.url + "/generate", json=generate_body(fresh + [7000]), timeout=60)
        assert warm.status_code == 200
        wait_for(
            lambda: mirror_of(router, victim.url) == engine_cache_tokens(revived) >= PREFIX_LEN,
            10,
            "the mirror of the restarted replica = its cache",
        )
        sent_before = by_worker(router.metrics(), REQUESTS).get(victim.url, 0)
        (answer,) = asyncio.run(generate_all(router.url, [fresh + [7001]], concurrency=1))
        assert answer["meta_info"]["cached_tokens"] >= PREFIX_LEN  # routed to its cache
        assert by_worker(router.metrics(), REQUESTS)[victim.url] == sent_before + 1
