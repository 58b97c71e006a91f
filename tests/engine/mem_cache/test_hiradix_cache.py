"""HiRadixCache over real pools: what is evicted from the device pool is demoted to the host
pool and to storage, and a later match brings back the same KV bytes.

The oracle is the KV itself: every inserted token gets random K/V in the device pool, and a
match must return slots that hold exactly those values, from whichever tier they came. Also:
the write policies, bounded host pool and storage, a storage page that is corrupt or cut
short (recomputed, never used), and the pool invariant free + evictable + protected == size.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.hicache_prefetch import PrefetchConfig
from radixserve.engine.mem_cache.hicache_storage import HiCacheFile, HiCacheStorage, StorageConfig
from radixserve.engine.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from radixserve.protocol import BlockRemoved, BlockStored

CPU = torch.device("cpu")
READ_ALL = PrefetchConfig("wait_complete", threshold=0)  # a waiting request takes every page
LAYERS, HEADS, DIM = 2, 2, 4


class World:
    """One rank's pools and HiCache; `truth` maps a token prefix to its K/V rows."""

    def __init__(  # noqa: PLR0913 - a test bench with every knob
        self,
        page: int = 1,
        pool: int = 64,
        host: int = 128,
        policy: str = "write_through",
        storage: HiCacheStorage | None = None,
        prefetch: PrefetchConfig = READ_ALL,
    ) -> None:
        self.kv = MHATokenToKVPool(pool, page, torch.float32, HEADS, DIM, LAYERS, CPU)
        self.alloc = create_allocator(pool, page, CPU)
        config = HiCacheConfig(
            host_size=host, write_policy=policy, storage=storage, prefetch=prefetch
        )
        self.cache = HiRadixCache(
            ReqToTokenPool(4, 512, CPU), self.alloc, self.kv, config, page, "lru", True
        )
        self.pool = pool

    def put(self, tokens: list[int], truth: dict[tuple[int, ...], torch.Tensor]) -> int:
        """Compute (random KV, the same for the same prefix) and insert, like the engine."""
        slots = self.alloc.alloc_extend([0], [len(tokens)], [-1])
        if slots is None:
            self.cache.evict(len(tokens) - self.alloc.available_size())
            slots = self.alloc.alloc_extend([0], [len(tokens)], [-1])
        assert slots is not None
        for i, slot in enumerate(slots.tolist()):
            rows = truth.setdefault(tuple(tokens[: i + 1]), torch.randn(2 * LAYERS, HEADS, DIM))
            for layer in range(LAYERS):
                self.kv.k_buffer[layer][slot] = rows[layer]
                self.kv.v_buffer[layer][slot] = rows[LAYERS + layer]
        prefix = self.cache.insert(list(tokens), slots)
        self.alloc.free(slots[:prefix])
        return prefix

    def check_match(self, tokens: list[int], truth: dict[tuple[int, ...], torch.Tensor]) -> int:
        """Match; every returned slot must hold the true KV of its position. Returns its length."""
        match = self.cache.match_prefix(list(tokens))
        for i, slot in enumerate(match.indices.tolist()):
            rows = truth[tuple(tokens[: i + 1])]
            for layer in range(LAYERS):
                assert torch.equal(self.kv.k_buffer[layer][slot], rows[layer])
                assert torch.equal(self.kv.v_buffer[layer][slot], rows[LAYERS + layer])
        self.check_invariant()
        return len(match.indices)

    def fetch(self, tokens: list[int], rid: str = "r") -> None:
        """What the scheduler does for a waiting request: prefetch, then poll until its policy
        lets it go (wait_complete here: until the read is done)."""
        self.cache.prefetch(rid, list(tokens))
        while not self.cache.prefetch_ready(rid, list(tokens)):
            time.sleep(0.001)

    def check_invariant(self) -> None:
        c = self.cache
        assert self.alloc.available_size() + c.evictable_size() + c.protected_size() == self.pool
        sizes = c.tier_sizes()
        assert sizes["both"] + sizes["host"] == c.host_tokens()  # no host slot leaks


def seq(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


@pytest.mark.parametrize("page", [1, 4])
def test_evicted_prefix_comes_back_from_host_with_the_same_kv(page: int) -> None:
    w, truth = World(page=page), {}
    a = seq(100, 16)
    w.put(a, truth)
    assert w.cache.tier_sizes() == {"device": 0, "both": 16, "host": 0}
    assert w.cache.evict(64) == 16
    assert w.cache.tier_sizes() == {"device": 0, "both": 0, "host": 16}
    assert w.alloc.available_size() == 64
    assert w.check_match(a, truth) == 16
    assert w.cache.stats.host_hit_tokens == 16
    assert w.cache.stats.load_back_tokens == 16
    # the loaded prefix is a device prefix again, with its host copy kept
    assert w.cache.tier_sizes() == {"device": 0, "both": 16, "host": 0}
    assert w.cache.peek_prefix(a).length == 16


def test_a_match_ending_inside_a_host_node_splits_it() -> None:
    w, truth = World(), {}
    w.put(seq(0, 12), truth)
    w.cache.evict(64)
    assert w.check_match([*seq(0, 5), 99], truth) == 5
    assert w.cache.tier_sizes() == {"device": 0, "both": 5, "host": 7}
    assert w.check_match(seq(0, 12), truth) == 12


def test_device_eviction_prefers_demoting_and_the_peek_counts_only_the_device() -> None:
    w, truth = World(pool=32, host=64), {}
    a, b = seq(0, 16), seq(100, 16)
    w.put(a, truth)
    w.put(b, truth)
    w.put(seq(200, 16), truth)  # the pool holds 32: the oldest (a) is demoted, not lost
    assert w.cache.peek_prefix(a).length == 0
    assert w.check_match(a, truth) == 16  # b is demoted in turn to make room
    assert w.cache.peek_prefix(b).length == 0
    assert w.check_match(b, truth) == 16


def test_write_back_copies_only_on_eviction() -> None:
    w, truth = World(policy="write_back"), {}
    a = seq(0, 8)
    w.put(a, truth)
    assert w.cache.host_tokens() == 0
    w.cache.evict(8)
    assert w.cache.tier_sizes()["host"] == 8
    assert w.check_match(a, truth) == 8


def test_write_through_selective_copies_on_the_second_hit() -> None:
    w, truth = World(policy="write_through_selective"), {}
    a = seq(0, 8)
    w.put(a, truth)
    w.cache.match_prefix(a)
    assert w.cache.host_tokens() == 0
    w.cache.match_prefix(a)
    assert w.cache.host_tokens() == 8
    w.cache.evict(8)  # backed up: demoted
    assert w.check_match(a, truth) == 8


def test_unbacked_leaf_is_dropped_with_the_host_nodes_under_it() -> None:
    w, truth = World(policy="write_through_selective"), {}
    w.put(seq(0, 8), truth)
    w.cache.match_prefix(seq(0, 8))
    w.cache.match_prefix(seq(0, 8))  # backed up
    w.put([*seq(0, 8), *seq(50, 8)], truth)  # child: not backed up (one hit)
    w.cache.evict(64)
    assert w.cache.tier_sizes() == {"device": 0, "both": 0, "host": 8}
    assert w.cache.stats.dropped_tokens == 8
    w.check_invariant()


def test_the_host_pool_stays_bounded_and_drops_its_least_recent_leaves() -> None:
    w, truth = World(pool=32, host=32), {}
    prompts = [seq(1000 * i, 16) for i in range(6)]
    for p in prompts:
        w.put(p, truth)
    w.cache.evict(64)
    assert w.cache.host_tokens() <= 32
    assert w.check_match(prompts[-1], truth) == 16  # the newest survived
    assert w.check_match(prompts[0], truth) == 0  # the oldest was dropped


def test_a_full_host_gives_up_copies_of_device_nodes_first() -> None:
    w, truth = World(pool=32, host=16), {}
    a, b = seq(0, 16), seq(100, 16)
    w.put(a, truth)
    w.put(b, truth)  # the host holds one copy: a's goes, the device still has a
    assert w.cache.tier_sizes() == {"device": 16, "both": 16, "host": 0}
    w.cache.evict(16)  # a is the oldest: copied down again, in place of b's copy
    assert w.cache.tier_sizes() == {"device": 16, "both": 0, "host": 16}
    assert w.check_match(a, truth) == 16
    assert w.check_match(b, truth) == 16


def test_without_device_room_the_host_part_is_recomputed_not_half_loaded() -> None:
    w, truth = World(pool=16, host=64), {}
    a = seq(0, 16)
    w.put(a, truth)
    w.cache.evict(16)
    hold = w.alloc.alloc_extend([0], [16], [-1])  # a running request owns the whole pool
    assert hold is not None
    assert len(w.cache.match_prefix(a).indices) == 0
    assert w.cache.tier_sizes() == {"device": 0, "both": 0, "host": 16}
    w.alloc.free(hold)
    assert w.check_match(a, truth) == 16


def test_inserting_through_a_demoted_node_reuses_the_callers_slots() -> None:
    w, truth = World(), {}
    a = seq(0, 8)
    w.put(a, truth)
    w.cache.evict(8)
    assert w.put([*a, *seq(20, 4)], truth) == 0  # nothing was on the device
    assert w.cache.tier_sizes() == {"device": 0, "both": 12, "host": 0}  # write-through
    assert w.check_match([*a, *seq(20, 4)], truth) == 12


def test_events_name_the_tier() -> None:
    w, truth = World(page=4), {}
    w.cache.take_events()  # AllBlocksCleared, from the start
    w.put(seq(0, 8), truth)
    w.cache.evict(8)
    w.cache.match_prefix(seq(0, 8))
    events = w.cache.take_events()
    assert all(isinstance(e, BlockStored | BlockRemoved) for e in events)
    kinds = [(type(e).__name__, getattr(e, "medium", None)) for e in events]
    assert kinds == [
        ("BlockStored", "GPU"), ("BlockStored", "GPU"),  # inserted: two pages
        ("BlockStored", "CPU_PINNED"), ("BlockStored", "CPU_PINNED"),  # write-through
        ("BlockRemoved", "GPU"), ("BlockRemoved", "GPU"),  # demoted
        ("BlockStored", "GPU"), ("BlockStored", "GPU"),  # loaded back
    ]  # fmt: skip
    w.cache.evict(8)
    assert w.cache.cached_page_hashes() == []  # the pool's pages only: both went to host
    w.cache.match_prefix(seq(0, 8))
    assert len(w.cache.cached_page_hashes()) == 2


# ---- storage ------------------------------------------------------------------------------------


def storage(path: Path, capacity: int = 1 << 30) -> HiCacheFile:
    return HiCacheFile(StorageConfig(path, capacity, "test-model"))


def test_another_replica_reads_the_prefix_from_shared_storage(tmp_path: Path) -> None:
    truth: dict[tuple[int, ...], torch.Tensor] = {}
    one = World(page=4, storage=storage(tmp_path))
    a = seq(0, 16)
    one.put(a, truth)
    one.cache.storage.flush()  # type: ignore[union-attr]
    assert len(list(tmp_path.glob("*.bin"))) == 4  # a file per page
    two = World(page=4, storage=storage(tmp_path))  # fresh pools: nothing cached here
    two.fetch([*a, 77])
    assert two.check_match([*a, 77], truth) == 16
    assert two.cache.stats.storage_hit_tokens == 16
    one.cache.close()
    two.cache.close()


@pytest.mark.parametrize("damage", ["flip", "truncate"])
def test_a_broken_storage_page_is_recomputed_never_used(tmp_path: Path, damage: str) -> None:
    truth: dict[tuple[int, ...], torch.Tensor] = {}
    one = World(page=4, storage=storage(tmp_path))
    a = seq(0, 16)
    one.put(a, truth)
    one.cache.storage.flush()  # type: ignore[union-attr]
    digests = one.cache.match_prefix(a).last_node.page_digests
    third = tmp_path / one.cache.storage.name_of(digests[2])  # type: ignore[union-attr]
    raw = third.read_bytes()
    third.write_bytes(raw[:-1] + bytes([raw[-1] ^ 1]) if damage == "flip" else raw[:-7])
    two = World(page=4, storage=storage(tmp_path))
    two.fetch(a)
    assert two.check_match(a, truth) == 8  # the two pages before the broken one
    assert not third.exists()  # deleted, so the next writer stores it again
    one.cache.close()
    two.cache.close()


def test_host_eviction_demotes_to_storage_and_storage_stays_within_capacity(
    tmp_path: Path,
) -> None:
    page_bytes = 4 * 2 * LAYERS * HEADS * DIM * 4
    store = storage(tmp_path, capacity=20 * (page_bytes + 64))
    w, truth = World(page=4, pool=32, host=32, storage=store), {}
    prompts = [seq(1000 * i, 16) for i in range(10)]
    for p in prompts:
        w.put(p, truth)
    store.flush()
    used = sum(f.stat().st_size for f in tmp_path.glob("*.bin"))
    assert used <= 20 * (page_bytes + 64)
    assert store.used_bytes() == used
    # the newest prompt is in storage even after the host pool let it go
    w.cache.evict(64)
    w.cache.evict_host(64)
    assert w.cache.host_tokens() == 0
    w.fetch(prompts[-1])
    assert w.check_match(prompts[-1], truth) == 16
    w.cache.close()


# ---- any sequence of operations keeps the tiers consistent --------------------------------------


OPS = st.lists(
    st.tuples(
        st.sampled_from(["put", "match", "evict", "evict_host"]),
        st.integers(0, 5),  # which prompt family
        st.integers(1, 5),  # length in pages
    ),
    max_size=40,
)


@settings(max_examples=60, deadline=None)
@given(ops=OPS, page=st.sampled_from([1, 4]), policy=st.sampled_from(
    ["write_through", "write_through_selective", "write_back"]
))  # fmt: skip
def test_random_operations_keep_kv_and_accounting_right(
    ops: list[tuple[str, int, int]], page: int, policy: str
) -> None:
    w, truth = World(page=page, pool=32, host=48, policy=policy), {}
    for op, family, pages in ops:
        tokens = [family * 10, *seq(family * 100, pages * page - 1)]  # families share nothing
        if op == "put":
            w.put(tokens, truth)
        elif op == "match":
            w.check_match(tokens, truth)
        elif op == "evict":
            w.cache.evict(pages * page)
        else:
            w.cache.evict_host(pages * page)
        w.check_invariant()
        assert w.cache.host_tokens() <= 48
