"""Selector: views over available ranks (worker DP ranks), sticky sessions and in-flight leases.

Real WorkerRegistry and CacheIndex (approximate trees: no engine needed); workers are marked
healthy by hand instead of by health checks, which the live tests cover.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import httpx
import pytest
import pytest_asyncio

from radixserve.router.config import RouterConfig
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.policies import make_policy
from radixserve.router.selector import Selector
from radixserve.router.workers import Worker, WorkerRegistry


def _healthy(registry: WorkerRegistry, url: str, dp_size: int = 1) -> Worker:
    worker = registry.add(url)
    worker.dp_size = dp_size
    worker.healthy = worker.ever_healthy = True
    for key in worker.rank_keys():
        registry.index.add_rank(key, 1)
    return worker


@pytest_asyncio.fixture
async def parts() -> AsyncIterator[tuple[WorkerRegistry, CacheIndex]]:
    async with httpx.AsyncClient() as client:
        index = CacheIndex()
        yield WorkerRegistry(RouterConfig(), client, index), index
        await index.aclose()


def _selector(registry: WorkerRegistry, index: CacheIndex, **cfg: object) -> Selector:
    return Selector(registry, index, make_policy(RouterConfig(**cfg)))  # type: ignore[arg-type]


@pytest.mark.asyncio
async def test_routed_prefix_is_remembered_and_followed(parts) -> None:
    registry, index = parts
    for port in (1, 2, 3):
        _healthy(registry, f"http://127.0.0.1:{port}")
    sel = _selector(registry, index)
    prefix = list(range(100, 400))
    first = sel.choose(prefix + [7, 8, 9])
    assert first is not None and first.cached_tokens == 0
    first.release()
    again = sel.choose(prefix + [1, 2])
    assert again is not None
    assert again.worker is first.worker and again.cached_tokens == len(prefix)


@pytest.mark.asyncio
async def test_leases_count_in_flight_work_and_release_once(parts) -> None:
    registry, index = parts
    worker = _healthy(registry, "http://127.0.0.1:1")
    sel = _selector(registry, index)
    a, b = sel.choose([1] * 50), sel.choose([2] * 30)
    assert a is not None and b is not None
    load = worker.load_of(0)
    assert (load.in_flight, load.in_flight_tokens) == (2, 80)
    a.release()
    a.release()  # idempotent: a double release must not make load negative
    assert (load.in_flight, load.in_flight_tokens) == (1, 30)
    b.release()
    assert (load.in_flight, load.in_flight_tokens) == (0, 0)


@pytest.mark.asyncio
async def test_unavailable_and_excluded_workers_are_skipped(parts) -> None:
    registry, index = parts
    a = _healthy(registry, "http://127.0.0.1:1")
    b = _healthy(registry, "http://127.0.0.1:2")
    sel = _selector(registry, index, policy="round_robin")
    a.healthy = False
    picks = {sel.choose([5]).worker.url for _ in range(4)}  # type: ignore[union-attr]
    assert picks == {b.url}
    assert sel.choose([5], exclude={b.url}) is None


@pytest.mark.asyncio
async def test_dp_ranks_are_scored_separately(parts) -> None:
    registry, index = parts
    _healthy(registry, "http://127.0.0.1:1", dp_size=4)
    sel = _selector(registry, index, policy="least_load")
    leases = [sel.choose([9, 9, 9]) for _ in range(4)]
    assert sorted(lease.dp_rank for lease in leases) == [0, 1, 2, 3]  # type: ignore[union-attr]


@pytest.mark.asyncio
async def test_sticky_session_keeps_its_rank_until_it_goes_away(parts) -> None:
    registry, index = parts
    workers = [_healthy(registry, f"http://127.0.0.1:{p}") for p in (1, 2, 3)]
    sel = _selector(registry, index, policy="round_robin", session_header="x-session-id")
    first = sel.choose([1, 2, 3], session="alice")
    assert first is not None
    for _ in range(5):
        assert sel.choose([4], session="alice").worker is first.worker  # type: ignore[union-attr]
    others = {sel.choose([4], session=f"s{i}").worker.url for i in range(6)}  # type: ignore[union-attr]
    assert len(others) == 3  # new sessions still spread
    first.worker.healthy = False
    moved = sel.choose([4], session="alice")
    assert moved is not None and moved.worker is not first.worker
    assert sel.choose([4], session="alice").worker is moved.worker  # type: ignore[union-attr]
    assert len(workers) == 3


@pytest.mark.asyncio
async def test_tier_credit_counts_each_lower_tier_past_the_ones_above(parts) -> None:
    """Host tokens past the pool's prefix at the host credit, storage tokens past both at the
    storage credit; a tier that holds less than the one above adds nothing."""
    from radixserve.router.mirror.index import PrefixMatch

    registry, index = parts
    selector = Selector(registry, index, make_policy(RouterConfig()), 0.75, 0.5)
    assert selector.tier_credit(PrefixMatch(100, 0, 400, 1000)) == 225 + 300
    assert selector.tier_credit(PrefixMatch(500, 0, 400, 300)) == 0
    assert selector.tier_credit(PrefixMatch(100, 0, 0, 300)) == 100
    blind = Selector(registry, index, make_policy(RouterConfig()))
    assert blind.tier_credit(PrefixMatch(100, 0, 400, 1000)) == 0
