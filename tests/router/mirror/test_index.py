"""CacheIndex: per-rank cached prefixes from live event streams (exact, equal to each
replica's own RadixCache) and from routed prompts (approx), stats, and rank lifecycle."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
import torch

from radixserve.engine.mem_cache.hicache_storage import HiCacheFile, StorageConfig
from radixserve.engine.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from radixserve.router.addresses import KVEndpoint, RankKey
from radixserve.router.mirror.index import CacheIndex
from tests.router.mirror.replica import Replica, engine_match, fresh_replica, until

pytestmark = pytest.mark.timeout(90)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def task_names() -> set[str]:
    return {t.get_name() for t in asyncio.all_tasks()}


class Traffic:
    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.system = [self.rng.randrange(30_000) for _ in range(64)]

    def prompt(self) -> list[int]:
        return self.system + [
            self.rng.randrange(30_000) for _ in range(self.rng.randrange(50, 150))
        ]


def synced(index: CacheIndex, key: RankKey, replica: Replica) -> bool:
    s = index.stats()[key]
    return s.last_seq == replica.last_seq and s.num_tokens == (
        replica.cache.evictable_size() + replica.cache.protected_size()
    )


def test_mirror_and_approx_ranks_side_by_side() -> None:
    async def scenario() -> None:
        traffic = Traffic(1)
        r1, r4 = fresh_replica(1, pool=2000), fresh_replica(4, pool=2000)
        a, b, c = ("http://127.0.0.1:1", 0), ("http://127.0.0.1:2", 0), ("http://127.0.0.1:3", 0)
        index = CacheIndex(approx_max_tokens=10_000)
        index.add_rank(a, 1, r1.kv)  # before start(): its subscriber starts with the index
        await index.start()
        index.add_rank(b, 16)  # no KV events: approx
        index.add_rank(c, 4, r4.kv)  # after start(): starts at once
        assert {f"kv-events {a[0]}#0", f"kv-events {c[0]}#0"} <= task_names()
        for r in (r1, r4):
            r.serve()
        sent = []
        for _ in range(25):
            sent.append(traffic.prompt())
            r1.insert(sent[-1])
            r4.insert(sent[-1])
        await until(lambda: synced(index, a, r1), "a", lambda: r1.insert(traffic.prompt()))
        await until(lambda: synced(index, c, r4), "c", lambda: r4.insert(traffic.prompt()))

        for q in [*sent, traffic.prompt(), traffic.system[:40]]:
            got = index.match(q, [a, b, c, ("http://127.0.0.1:4", 0)])
            want = {a: engine_match(r1.cache, q), b: 0, c: engine_match(r4.cache, q)}
            assert got == {**want, ("http://127.0.0.1:4", 0): 0}

        q = sent[0]
        before = index.match(q, [a])[a]
        index.on_routed(a, q + [1, 2, 3])  # a mirror learns from its events only
        index.on_routed(b, q)
        assert index.match(q + [7], [a, b]) == {a: before, b: len(q) // 16 * 16}

        stats = index.stats()
        assert (stats[a].mode, stats[b].mode, stats[c].mode) == ("events", "approx", "events")
        assert stats[a].num_blocks == len(r1.cache.cached_page_hashes())
        assert (
            stats[c].num_blocks * 4
            == stats[c].num_tokens
            == (r4.cache.evictable_size() + r4.cache.protected_size())
        )
        assert stats[b].num_tokens == len(q) and stats[b].last_seq == -1
        assert stats[a].resets == 0 and stats[a].replays <= 1

        await index.remove_rank(a)
        assert f"kv-events {a[0]}#0" not in task_names()
        assert a not in index and a not in index.stats()
        assert index.match(q, [a]) == {a: 0}
        await index.aclose()
        assert not any(name.startswith("kv-events") for name in task_names())
        for r in (r1, r4):
            await r.close()

    run(scenario)


def test_an_engine_bound_to_all_interfaces_is_dialled_at_the_workers_host() -> None:
    async def scenario() -> None:
        traffic = Traffic(2)
        replica = fresh_replica(host="127.0.0.2")  # dialling 0.0.0.0 would reach 127.0.0.1
        port = replica.port
        replica.serve()
        key = ("http://127.0.0.2:9", 0)
        kv = KVEndpoint(0, f"tcp://0.0.0.0:{port}", f"tcp://0.0.0.0:{port + 1}")
        index = CacheIndex()
        await index.start()
        index.add_rank(key, 1, kv)
        for _ in range(5):
            replica.insert(traffic.prompt())
        await until(
            lambda: synced(index, key, replica), "synced", lambda: replica.insert(traffic.prompt())
        )
        assert index.stats()[key].num_tokens > 0
        await index.aclose()
        await replica.close()

    run(scenario)


def test_bad_arguments_name_the_field() -> None:
    async def scenario() -> None:
        index = CacheIndex()
        key = ("http://127.0.0.1:1", 0)
        with pytest.raises(ValueError, match="page_size"):
            index.add_rank(key, 0)
        index.add_rank(key, 16)
        index.add_rank(key, 16)  # same settings: nothing to do
        with pytest.raises(ValueError, match="key"):
            index.add_rank(key, 16, KVEndpoint(0, "tcp://127.0.0.1:1"))
        with pytest.raises(ValueError, match="tokens"):
            index.match([1, -1], [key])
        await index.remove_rank(("http://127.0.0.1:2", 0))  # unknown: no-op
        await index.aclose()
        with pytest.raises(ValueError, match="max_tokens"):
            CacheIndex(approx_max_tokens=-1)

    run(scenario)


def _distinct_tokens(prompts: list[list[int]]) -> int:
    """Oracle: the number of distinct prefixes (= trie nodes) over the prompts."""
    return len({tuple(p[: i + 1]) for p in prompts for i in range(len(p))})


def test_working_set_counts_distinct_routed_tokens_up_to_twice_the_pool() -> None:
    async def scenario() -> None:
        index = CacheIndex()
        events, approx, unknown = (("http://127.0.0.1:1", r) for r in (0, 1, 2))
        index.add_rank(events, 1, KVEndpoint(0, "tcp://127.0.0.1:1"), pool_tokens=1000)
        index.add_rank(approx, 1, pool_tokens=1000)
        index.add_rank(unknown, 1)
        with pytest.raises(ValueError, match="pool_tokens"):
            index.add_rank(("http://127.0.0.1:9", 0), 1, pool_tokens=-1)
        rng = random.Random(5)
        tenant = [rng.randrange(30_000) for _ in range(300)]
        prompts = [tenant + [rng.randrange(30_000) for _ in range(40)] for _ in range(3)]
        for key in (events, approx, unknown):
            for p in prompts:
                index.on_routed(key, p)
        # a tenant's prefix counts once, each question apart (in flight or finished alike)
        assert index.working_set_of(events) == _distinct_tokens(prompts) == 420
        assert index.working_set_of(approx) == 420
        assert index.working_set_of(unknown) == 0  # no pool size: no working set kept
        # bounded at twice the pool; the newest prompts are what it keeps
        others = [[rng.randrange(30_000) for _ in range(500)] for _ in range(5)]
        for p in others:
            index.on_routed(events, p)
        assert index.working_set_of(events) == 2000
        assert index.match(others[-1], [approx])[approx] == 0  # ranks do not share it
        await index.aclose()

    run(scenario)


def host_prefix(cache: HiRadixCache, tokens: list[int]) -> int:
    """The engine's own host-tier prefix: the nodes from the root that have a host copy."""
    node, key, n = cache.root, list(tokens), 0
    while key:
        child = node.children.get(key[0])
        if child is None or child.host_value is None:
            break
        common = 0
        while common < min(len(child.key), len(key)) and child.key[common] == key[common]:
            common += 1
        n += common
        if common < len(child.key):
            break
        node, key = child, key[common:]
    return n


def test_host_tier_events_feed_a_second_mirror() -> None:
    """A HiCache replica: device events keep the device mirror equal to the KV pool, host
    events (medium CPU_PINNED) build the host mirror, equal to the engine's host tier."""

    async def scenario() -> None:
        traffic = Traffic(3)
        r = fresh_replica(1, pool=600)
        device = MHATokenToKVPool(600, 1, torch.float32, 1, 2, 1, torch.device("cpu"))
        r.cache = HiRadixCache(
            ReqToTokenPool(2, 8, torch.device("cpu")), r.cache.allocator, device,
            HiCacheConfig(host_size=3000), 1, "lru", True,
        )  # fmt: skip
        key = ("http://127.0.0.1:1", 0)
        index = CacheIndex()
        index.add_rank(key, 1, r.kv)
        await index.start()
        r.serve()
        sent = [traffic.prompt() for _ in range(45)]  # ~7x the pool, ~1.5x the host tier
        for q in sent:
            r.insert(q)
        await until(lambda: synced(index, key, r), "synced", lambda: r.insert(traffic.prompt()))
        assert r.cache.tier_sizes()["host"] > 0 and r.cache.stats.backup_tokens > 3000
        for q in sent:
            got = index.match_both(q, [key])[key]
            assert got.cached == r.cache.peek_prefix(q).length
            assert got.host == host_prefix(r.cache, q)
        assert any(index.match_both(q, [key])[key].host > 100 for q in sent)
        await r.close()
        await index.aclose()

    run(scenario)


def hi_replica(page: int, pool: int, host: int, storage: HiCacheFile | None = None) -> Replica:
    r = fresh_replica(page, pool=pool)
    device = MHATokenToKVPool(pool, page, torch.float32, 1, 2, 1, torch.device("cpu"))
    r.cache = HiRadixCache(
        ReqToTokenPool(2, 8, torch.device("cpu")), r.cache.allocator, device,
        HiCacheConfig(host_size=host, storage=storage), page, "lru", True,
    )  # fmt: skip
    return r


def test_a_shared_storage_mirror_credits_every_replica_that_reads_it(tmp_path: Path) -> None:
    """Two HiCache replicas over one storage folder (same storage id): pages one of them
    stored (DISK events) count as the other's storage prefix; a third replica with its own
    folder sees none of them; a page the storage deletes leaves the mirror."""

    async def scenario() -> None:
        traffic = Traffic(5)
        shared = [HiCacheFile(StorageConfig(tmp_path / "a", 1 << 30, "m")) for _ in range(2)]
        own = HiCacheFile(StorageConfig(tmp_path / "b", 1 << 30, "m"))
        reps = [hi_replica(4, 400, 800, s) for s in (*shared, own)]
        keys = [(f"http://127.0.0.1:{i + 1}", 0) for i in range(3)]
        ids = [s.storage_id() for s in (*shared, own)]
        assert ids[0] == ids[1] != ids[2]
        index = CacheIndex()
        for key, rep, sid in zip(keys, reps, ids, strict=True):
            index.add_rank(key, 4, rep.kv, storage_id=sid)
        await index.start()
        for rep in reps:
            rep.serve()
        sent = [traffic.prompt() for _ in range(6)]
        for q in sent:
            reps[0].insert(q)  # only the first replica computes them
        for i in (1, 2):
            reps[i].insert(traffic.prompt())

        def poke() -> None:
            for r in reps[1:]:
                r.insert(traffic.prompt())

        await until(
            lambda: all(synced(index, k, r) for k, r in zip(keys, reps, strict=True)),
            "synced",
            poke,
        )
        for q in sent:
            got = index.match_both(q, keys)
            aligned = (len(q) // 4) * 4
            assert got[keys[0]].storage == aligned  # written through to storage at insert
            assert got[keys[1]].storage == aligned  # the same storage: the same prefix
            assert got[keys[1]].cached <= len(traffic.system)  # its own pool: the shared head
            assert got[keys[2]].storage <= len(traffic.system)  # another folder: its own only
        shared[0].flush()
        victim = reps[0].cache.match_prefix(sent[0]).last_node
        name = shared[0].name_of(victim.page_digests[-1])
        shared[0]._delete(name)  # as the capacity eviction does
        reps[0].flush()
        await until(
            lambda: index.match_both(sent[0], keys)[keys[1]].storage < len(sent[0]) // 4 * 4,
            "removed",
            reps[0].flush,
        )
        for r in reps:
            await r.close()
        for s in (*shared, own):
            s.close()
        await index.aclose()

    run(scenario)
