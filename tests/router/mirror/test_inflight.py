"""InflightOverlay: a routed prompt arrives on its rank from routing until its events store
it, the request ends or fails, or its TTL passes; never reported as cached; bounded memory.

The confirmation and selector cases run against the engine's real RadixCache and publisher
(`Replica`) over ZMQ on 127.0.0.1; the TTL case injects a clock (the overlay's only input).
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.router.config import RouterConfig
from radixserve.router.mirror.index import CacheIndex, PrefixMatch
from radixserve.router.mirror.inflight import InflightOverlay, OverlayLimits
from radixserve.router.mirror.tree import encode_tokens
from radixserve.router.policies import make_policy
from radixserve.router.selector import Selector
from radixserve.router.workers import WorkerRegistry
from tests.router.mirror.replica import Replica, fresh_replica, until

pytestmark = pytest.mark.timeout(90)


def enc(tokens: list[int]) -> bytes:
    return encode_tokens(tokens)


def test_added_prompts_match_by_whole_pages_and_go_on_discard() -> None:
    overlay = InflightOverlay(4)
    a = overlay.add(enc(list(range(10))))  # 2 whole pages count, the tail of 2 does not
    b = overlay.add(enc(list(range(6)) + [99, 98, 97, 96]))
    assert overlay.match_encoded(enc(list(range(12)))) == 8
    assert overlay.match_encoded(enc([*range(6), 99, 98, 97, 96, 1])) == 8
    assert overlay.match_encoded(enc([1, 2, 3, 4])) == 0
    overlay.discard(a)
    assert overlay.match_encoded(enc(list(range(12)))) == 4  # b still shares the first page
    overlay.discard(b)
    overlay.discard(b)  # twice, or unknown: no-op
    assert (overlay.match_encoded(enc(list(range(12)))), overlay.num_tokens) == (0, 0)


def test_entries_expire_after_their_ttl() -> None:
    now = [100.0]
    overlay = InflightOverlay(1, OverlayLimits(ttl_s=5.0), clock=lambda: now[0])
    overlay.add(enc([1, 2, 3]))
    now[0] = 103.0
    overlay.add(enc([1, 2, 9]))
    assert overlay.match_encoded(enc([1, 2, 3])) == 3
    now[0] = 105.5  # the first is past its deadline, the second is not
    assert overlay.match_encoded(enc([1, 2, 3])) == 2
    now[0] = 108.5
    assert (overlay.match_encoded(enc([1, 2, 9])), overlay.num_entries) == (0, 0)


def test_memory_is_bounded_oldest_entries_first() -> None:
    overlay = InflightOverlay(1, OverlayLimits(max_entries=3, max_tokens=250))
    prompts = [[i] * 100 for i in range(1, 6)]
    for p in prompts:
        overlay.add(enc(p))
        assert overlay.num_entries <= 3 and overlay.num_tokens <= 250
    assert [overlay.match_encoded(enc(p)) for p in prompts] == [0, 0, 0, 100, 100]
    assert InflightOverlay(1, OverlayLimits(max_entries=0)).add(enc([1])) >= 0
    with pytest.raises(ValueError, match="inflight_ttl_s"):
        OverlayLimits(ttl_s=0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 5), st.integers(1, 40)), max_size=40))
def test_match_equals_the_longest_prefix_among_live_entries(ops: list) -> None:
    rng, page = random.Random(len(ops)), 2
    bases = [[rng.randrange(1, 4) for _ in range(40)] for _ in range(3)]
    overlay, live = InflightOverlay(page), {}
    for is_add, which, n in ops:
        if is_add or not live:
            prompt = bases[which % 3][:n] + [which] * (which % 2)
            live[overlay.add(enc(prompt))] = prompt
        else:
            overlay.discard(next(iter(live)))
            del live[next(iter(live))]
        for q in bases:
            best = 0
            for p in live.values():
                k = 0
                while k < min(len(p), len(q)) and p[k] == q[k]:
                    k += 1
                best = max(best, k - k % page)
            assert overlay.match_encoded(enc(q)) == best
    for entry in list(live):
        overlay.discard(entry)
    assert overlay.num_tokens == 0


@pytest_asyncio.fixture
async def live() -> AsyncIterator[tuple[Selector, CacheIndex, list[Replica]]]:
    """Three event ranks fed by real replicas (RadixCache + ZMQ publisher), and a Selector."""
    replicas = [fresh_replica(1, pool=4000) for _ in range(3)]
    async with httpx.AsyncClient() as client:
        index = CacheIndex()
        registry = WorkerRegistry(RouterConfig(), client, index)
        await index.start()
        for i, r in enumerate(replicas):
            r.serve()
            worker = registry.add(f"http://127.0.0.1:{21000 + i}")
            worker.healthy = worker.ever_healthy = True
            index.add_rank((worker.url, 0), 1, r.kv)
        yield Selector(registry, index, make_policy(RouterConfig())), index, replicas
        await index.aclose()
        for r in replicas:
            await r.close()


def _replica_of(lease_url: str, replicas: list[Replica]) -> Replica:
    return replicas[int(lease_url.rsplit(":", 1)[1]) - 21000]


@pytest.mark.asyncio
async def test_a_burst_follows_its_first_request_but_is_never_counted_cached(live) -> None:
    selector, index, _ = live
    prefix = list(range(1000, 1600))
    first = selector.choose(prefix + [1, 2, 3])
    assert first is not None
    key = (first.worker.url, 0)
    for i in range(4):  # nothing is cached anywhere yet: only the overlay knows
        follower = selector.choose(prefix + [10 + i, 1])
        assert follower is not None and follower.worker is first.worker
        assert (follower.cached_tokens, follower.expected_tokens) == (0, len(prefix))
        assert follower.uncached == 2  # queued work: only what the overlay does not cover
    views = {v.key: v for v in selector.views(prefix, ())}
    assert views[key].inflight_tokens == len(prefix) and views[key].cached_tokens == 0
    assert all(v.inflight_tokens == 0 for k, v in views.items() if k != key)


@pytest.mark.asyncio
async def test_finished_or_failed_requests_stop_arriving(live) -> None:
    selector, index, _ = live
    prompt = list(range(5000, 5300))
    leases = [selector.choose(prompt + [i]) for i in range(2)]
    assert leases[0] is not None and leases[1] is not None
    key = (leases[0].worker.url, 0)
    overlay = index.overlay_of(key)
    assert overlay is not None and overlay.num_entries == 2
    leases[0].release()  # the request ended (the proxy releases on success and on failure)
    assert index.match_both(prompt, [key])[key] == PrefixMatch(0, len(prompt))
    leases[1].release()
    leases[1].release()
    assert index.match_both(prompt, [key])[key] == PrefixMatch(0, 0)
    assert overlay.num_entries == 0 and overlay.num_tokens == 0


@pytest.mark.asyncio
async def test_the_replicas_events_confirm_the_pages_and_retire_the_entry(live) -> None:
    selector, index, replicas = live
    prompt = list(range(7000, 7400))
    lease = selector.choose(prompt)
    assert lease is not None
    key, replica = (lease.worker.url, 0), _replica_of(lease.worker.url, replicas)
    overlay = index.overlay_of(key)
    assert overlay is not None and overlay.num_entries == 1
    replica.insert(prompt)  # the replica prefilled it and publishes its BlockStored events
    await until(lambda: overlay.num_entries == 0, "confirmed", lambda: replica.insert(prompt))
    assert index.match_both(prompt, [key])[key] == PrefixMatch(len(prompt), 0)
    again = selector.choose(prompt + [1])
    assert again is not None and again.worker is lease.worker
    assert again.cached_tokens == len(prompt)  # now it is cached, and reported so
    lease.release()
    again.release()
    await asyncio.sleep(0)
