"""KV events of the RadixCache: BlockStored per new page (chained), nothing on a split,
BlockRemoved for evicted pages, AllBlocksCleared on start/reset, and a replayed mirror that
always equals the tree."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.mem_cache.tree_node import TreeNode
from radixserve.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    block_hashes,
    digest_to_int64,
)

CPU = torch.device("cpu")


def make_cache(page_size: int = 4, pool: int = 256, events: bool = True) -> RadixCache:
    return RadixCache(
        ReqToTokenPool(4, 512, CPU),
        create_allocator(pool, page_size, CPU),
        page_size=page_size,
        eviction_policy="lru",
        enable_events=events,
    )


def put(cache: RadixCache, tokens: list[int]) -> int:
    slots = cache.allocator.alloc_extend([0], [len(tokens)], [-1])
    assert slots is not None
    prefix = cache.insert(list(tokens), slots)
    cache.allocator.free(slots[:prefix])
    return prefix


def stored(cache: RadixCache, tokens: list[int]) -> list[BlockStored]:
    """Insert tokens after draining old events; return the BlockStored events it emitted."""
    cache.take_events()
    put(cache, tokens)
    events = cache.take_events()
    assert all(isinstance(e, BlockStored) for e in events)
    return events  # type: ignore[return-value]


def removed_hashes(events: list[KVCacheEvent]) -> list[int]:
    assert all(isinstance(e, BlockRemoved) for e in events)
    return [h for e in events for h in e.block_hashes]  # type: ignore[union-attr]


A = list(range(100, 112))  # three pages of 4


# ---- AllBlocksCleared -------------------------------------------------------------------------


def test_construction_emits_all_blocks_cleared() -> None:
    assert make_cache().take_events() == [AllBlocksCleared()]


def test_reset_emits_all_blocks_cleared() -> None:
    cache = make_cache()
    put(cache, A)
    cache.take_events()
    cache.reset()
    assert cache.take_events() == [AllBlocksCleared()]


def test_take_events_drains_the_queue() -> None:
    cache = make_cache()
    cache.take_events()
    assert cache.take_events() == []


def test_disabled_events_emit_nothing() -> None:
    cache = make_cache(events=False)
    put(cache, A)
    cache.match_prefix(A[:4])
    cache.evict(100)
    cache.reset()
    assert cache.take_events() == []


# ---- BlockStored ------------------------------------------------------------------------------


def test_insert_emits_one_block_stored_per_page() -> None:
    events = stored(make_cache(), A)
    hashes = block_hashes(A, 4)
    assert len(events) == 3
    assert [e.block_hashes for e in events] == [[h] for h in hashes]
    assert [e.token_ids for e in events] == [A[0:4], A[4:8], A[8:12]]
    assert all(e.block_size == 4 and e.lora_id is None for e in events)


def test_pages_chain_from_none_at_the_root() -> None:
    events = stored(make_cache(), A)
    hashes = block_hashes(A, 4)
    assert [e.parent_block_hash for e in events] == [None, hashes[0], hashes[1]]


def test_page_size_one_emits_one_block_per_token() -> None:
    events = stored(make_cache(page_size=1), [7, 8, 9])
    assert [e.token_ids for e in events] == [[7], [8], [9]]
    assert [e.block_size for e in events] == [1, 1, 1]
    assert [e.parent_block_hash for e in events] == [None, *block_hashes([7, 8], 1)]


def test_second_root_child_also_starts_with_no_parent() -> None:
    cache = make_cache()
    put(cache, A)
    events = stored(cache, [1, 2, 3, 4])
    assert len(events) == 1 and events[0].parent_block_hash is None


def test_extension_emits_only_new_pages_chained_to_the_parent() -> None:
    cache = make_cache()
    put(cache, A)
    longer = [*A, 1, 2, 3, 4]
    events = stored(cache, longer)
    assert len(events) == 1
    assert events[0].block_hashes == [block_hashes(longer, 4)[3]]
    assert events[0].parent_block_hash == block_hashes(A, 4)[2]
    assert events[0].token_ids == [1, 2, 3, 4]


def test_insert_that_splits_chains_to_the_split_point() -> None:
    cache = make_cache()
    put(cache, A)
    branch = [*A[:4], 7, 7, 7, 7, 8, 8, 8, 8]
    events = stored(cache, branch)
    want = block_hashes(branch, 4)
    assert [e.block_hashes for e in events] == [[want[1]], [want[2]]]
    assert [e.parent_block_hash for e in events] == [want[0], want[1]]


def test_reinserting_a_cached_sequence_emits_nothing() -> None:
    cache = make_cache()
    put(cache, A)
    assert stored(cache, A) == []
    assert stored(cache, A[:8]) == []


def test_match_that_splits_a_node_emits_nothing() -> None:
    cache = make_cache()
    put(cache, A)
    cache.take_events()
    m = cache.match_prefix(A[:4] + [0, 0, 0, 0])
    assert m.last_node.key == A[:4]  # the node was split
    assert cache.take_events() == []


# ---- BlockRemoved -----------------------------------------------------------------------------


def test_evict_removes_exactly_the_stored_hashes() -> None:
    cache = make_cache()
    put(cache, A)
    cache.take_events()
    assert cache.evict(100) == 12
    assert removed_hashes(cache.take_events()) == block_hashes(A, 4)


def test_evict_after_split_removes_each_page_once_leaf_first() -> None:
    cache = make_cache()
    put(cache, A)
    cache.match_prefix(A[:4])  # split: [A0..A3] → [A4..A11]
    cache.take_events()
    cache.evict(100)
    h = block_hashes(A, 4)
    assert removed_hashes(cache.take_events()) == [h[1], h[2], h[0]]


def test_evict_of_a_locked_branch_removes_only_the_free_leaf() -> None:
    cache = make_cache()
    put(cache, A)
    branch = [*A[:4], 7, 7, 7, 7]
    put(cache, branch)
    cache.inc_lock_ref(cache.match_prefix(A).last_node)
    cache.take_events()
    cache.evict(100)
    assert removed_hashes(cache.take_events()) == [block_hashes(branch, 4)[1]]


def test_trimming_a_leaf_removes_only_its_tail_pages() -> None:
    cache = make_cache()
    put(cache, A)
    cache.take_events()
    assert cache.evict(5) == 8
    h = block_hashes(A, 4)
    assert removed_hashes(cache.take_events()) == [h[1], h[2]]
    assert cache.match_prefix(A).indices.numel() == 4
    assert stored(cache, A)[0].parent_block_hash == h[0]  # re-stored pages chain to the head


def test_evict_emits_one_block_removed_per_page() -> None:
    cache = make_cache()
    put(cache, A)
    cache.take_events()
    cache.evict(100)
    events = cache.take_events()
    assert [e.block_hashes for e in events] == [[h] for h in block_hashes(A, 4)]


# ---- replayed mirror == tree ------------------------------------------------------------------


def tree_pages(cache: RadixCache) -> dict[int, tuple[int | None, list[int]]]:
    """hash → (parent hash, page tokens) for every page currently in the tree."""
    ps, out = cache.page_size, {}
    stack: list[TreeNode] = list(cache.root.children.values())
    while stack:
        node = stack.pop()
        assert node.parent is not None
        prev = node.parent.last_digest()
        for i, digest in enumerate(node.page_digests):
            parent = digest_to_int64(prev) if prev is not None else None
            out[digest_to_int64(digest)] = (parent, node.key[i * ps : (i + 1) * ps])
            prev = digest
        stack.extend(node.children.values())
    return out


def replay(events: list[KVCacheEvent], mirror: dict) -> None:
    for e in events:
        if isinstance(e, AllBlocksCleared):
            mirror.clear()
        elif isinstance(e, BlockStored):
            assert len(e.block_hashes) == 1 and e.block_size == len(e.token_ids)
            assert e.block_hashes[0] not in mirror
            mirror[e.block_hashes[0]] = (e.parent_block_hash, e.token_ids)
        else:
            for h in e.block_hashes:
                del mirror[h]  # KeyError: removal of a page never stored


ops = st.lists(
    st.one_of(
        st.tuples(st.just("insert"), st.lists(st.integers(0, 2), min_size=1, max_size=16)),
        st.tuples(st.just("lock"), st.lists(st.integers(0, 2), min_size=1, max_size=16)),
        st.tuples(st.just("match"), st.lists(st.integers(0, 2), min_size=1, max_size=16)),
        st.tuples(st.just("evict"), st.integers(1, 24)),
        st.tuples(st.just("reset"), st.none()),
    ),
    max_size=40,
)


@pytest.mark.parametrize("page_size", [1, 4])
@settings(max_examples=150, deadline=None)
@given(seq=ops)
def test_replayed_events_mirror_the_tree(page_size: int, seq: list) -> None:
    cache = make_cache(page_size=page_size, pool=48)
    mirror: dict[int, tuple[int | None, list[int]]] = {}
    for op, arg in seq:
        if op == "insert":
            key = arg[: len(arg) // page_size * page_size]
            if key and cache.allocator.available_size() < len(key):
                cache.evict(len(key) - cache.allocator.available_size())
            if key and cache.allocator.available_size() >= len(key):
                put(cache, key)
        elif op in ("lock", "match"):
            node = cache.match_prefix(arg).last_node
            if op == "lock":
                cache.inc_lock_ref(node)
        elif op == "evict":
            cache.evict(arg)
        else:
            cache.reset()
            cache.allocator.clear()
        replay(cache.take_events(), mirror)
        assert mirror == tree_pages(cache)
