"""RadixCache: match/insert/split (page sizes 1 and 16), lock accounting, eviction order and
the pool invariant free + evictable + protected == pool size."""

from __future__ import annotations

import time

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.mem_cache.tree_node import TreeNode

CPU = torch.device("cpu")


def make_cache(page_size: int = 1, pool: int = 256, policy: str = "lru") -> RadixCache:
    alloc = create_allocator(pool, page_size, CPU)
    return RadixCache(ReqToTokenPool(4, 512, CPU), alloc, page_size, policy, enable_events=True)


def put(cache: RadixCache, tokens: list[int]) -> tuple[int, torch.Tensor]:
    """Insert like the engine: fresh slots, then free the duplicate (already cached) part."""
    slots = cache.allocator.alloc_extend([0], [len(tokens)], [-1])
    assert slots is not None
    prefix = cache.insert(list(tokens), slots)
    cache.allocator.free(slots[:prefix])
    return prefix, slots


def cached_size(cache: RadixCache) -> int:
    """Tokens held by the tree, locked or not."""
    return cache.evictable_size() + cache.protected_size()


def tree_nodes(cache: RadixCache) -> list[TreeNode]:
    nodes = list(cache.root.children.values())
    for node in nodes:  # the list grows while we walk it: breadth-first
        nodes.extend(node.children.values())
    return nodes


def only_child(node: TreeNode) -> TreeNode:
    assert len(node.children) == 1
    return next(iter(node.children.values()))


def fork(cache: RadixCache) -> tuple[TreeNode, TreeNode, TreeNode]:
    """root → U[1,2] → {A[3,4], B[5,6,7]}; returns (U, A, B)."""
    put(cache, [1, 2, 3, 4])
    put(cache, [1, 2, 5, 6, 7])
    a, b = cache.match_prefix([1, 2, 3, 4]).last_node, cache.match_prefix([1, 2, 5, 6, 7]).last_node
    return only_child(cache.root), a, b


def test_exact_match_returns_the_inserted_slots() -> None:
    cache = make_cache()
    _, slots = put(cache, [1, 2, 3, 4, 5, 6])
    m = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert torch.equal(m.indices, slots) and m.last_node.key == [1, 2, 3, 4, 5, 6]


def test_insert_returns_the_already_cached_prefix_length() -> None:
    cache = make_cache()
    assert put(cache, [1, 2, 3, 4])[0] == 0
    assert put(cache, [1, 2, 3, 7, 8])[0] == 3
    assert put(cache, [1, 2, 3, 4])[0] == 4
    assert put(cache, [1, 2, 3, 4, 5])[0] == 4
    assert put(cache, [9])[0] == 0


def test_insert_keeps_the_older_slots_for_the_shared_prefix() -> None:
    cache = make_cache()
    _, first = put(cache, [1, 2, 3, 4])
    _, second = put(cache, [1, 2, 3, 7, 8])
    got = cache.match_prefix([1, 2, 3, 7, 8]).indices
    assert torch.equal(got, torch.cat((first[:3], second[3:])))
    assert cache.evictable_size() == 256 - cache.allocator.available_size() == 6


P, SEQ = 16, list(range(100, 132))  # two full pages


def test_paged_match_truncates_the_key_to_page_multiples() -> None:
    cache = make_cache(page_size=P)
    _, slots = put(cache, SEQ)
    assert cache.match_prefix(SEQ[:31]).indices.numel() == 16
    miss = cache.match_prefix(SEQ[:15])  # no full page: no match at all
    assert miss.indices.numel() == 0 and miss.indices.dtype == torch.int64
    assert miss.last_node is cache.root
    assert torch.equal(cache.match_prefix([*SEQ, 1, 2, 3]).indices, slots)


@pytest.mark.parametrize(
    ("page_size", "seq", "probe", "cut"),
    [(1, [1, 2, 3, 4, 5], [1, 2, 3, 9], 3), (P, SEQ, SEQ[:20] + [0] * 12, 16)],
)
def test_partial_match_splits_the_node_at_the_page_aligned_match(
    page_size: int, seq: list[int], probe: list[int], cut: int
) -> None:
    cache = make_cache(page_size=page_size)
    _, slots = put(cache, seq)
    m = cache.match_prefix(probe)
    assert torch.equal(m.indices, slots[:cut])
    assert m.last_node.key == seq[:cut] and only_child(cache.root) is m.last_node
    lower = only_child(m.last_node)
    assert lower.key == seq[cut:] and torch.equal(lower.value, slots[cut:])
    assert cached_size(cache) == len(seq)


def test_paged_insert_splits_only_at_a_page_boundary() -> None:
    cache = make_cache(page_size=P)
    put(cache, SEQ)
    assert put(cache, SEQ[:20] + [0] * 12)[0] == 16
    upper = only_child(cache.root)
    assert upper.key == SEQ[:16]
    assert sorted(len(c.key) for c in upper.children.values()) == [16, 16]
    assert cached_size(cache) == 256 - cache.allocator.available_size() == 48


def test_lock_protects_node_and_ancestors_until_the_last_unlock() -> None:
    cache = make_cache()
    _, _, b = fork(cache)
    cache.inc_lock_ref(b)
    cache.inc_lock_ref(b)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.dec_lock_ref(b)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    cache.dec_lock_ref(b)
    assert (cache.evictable_size(), cache.protected_size()) == (7, 0)


def test_shared_ancestor_stays_protected_while_a_sibling_holds_it() -> None:
    cache = make_cache()
    u, a, b = fork(cache)
    cache.inc_lock_ref(a)
    cache.inc_lock_ref(b)
    assert (cache.evictable_size(), cache.protected_size()) == (0, 7)
    cache.dec_lock_ref(a)
    assert (cache.evictable_size(), cache.protected_size()) == (2, 5)
    assert u.lock_ref == 1


def test_split_of_a_locked_node_keeps_the_accounting() -> None:
    cache = make_cache()
    put(cache, [1, 2, 3, 4, 5])
    node = cache.match_prefix([1, 2, 3, 4, 5]).last_node
    cache.inc_lock_ref(node)
    cache.match_prefix([1, 2, 9])  # split above the locked node
    assert (cache.evictable_size(), cache.protected_size()) == (0, 5)
    cache.dec_lock_ref(node)
    assert (cache.evictable_size(), cache.protected_size()) == (5, 0)


def test_evict_skips_locked_leaves() -> None:
    cache = make_cache()
    _, _, b = fork(cache)
    cache.inc_lock_ref(b)
    assert cache.evict(100) == 2
    assert cache.allocator.available_size() == 256 - 5
    assert cache.match_prefix([1, 2, 3, 4]).indices.numel() == 2


def _three_leaves(cache: RadixCache) -> list[TreeNode]:
    for first in (10, 20, 30):
        put(cache, [first, first + 1])
    return [cache.match_prefix([f, f + 1]).last_node for f in (10, 20, 30)]


def _evict_order(cache: RadixCache, n: int) -> list[int]:
    """The first tokens of the next n victims, each evicted whole: evict(1) picks the victim
    (trimming its tail), evicting what is left of it removes it (it stays first in order)."""
    order = []
    for _ in range(n):
        before = {node.key[0]: (node, len(node.key)) for node in tree_nodes(cache)}
        cache.evict(1)
        after = {id(node): len(node.key) for node in tree_nodes(cache)}
        (victim,) = [k for k, (nd, ln) in before.items() if after.get(id(nd), 0) < ln]
        node, _ = before[victim]
        if id(node) in after:
            cache.evict(after[id(node)])
        assert id(node) not in {id(x) for x in tree_nodes(cache)}
        order.append(victim)
    return order


def test_inner_node_is_never_evicted_before_its_children() -> None:
    cache = make_cache()
    u, a, b = fork(cache)
    put(cache, [9])
    c = cache.match_prefix([9]).last_node
    u.last_access_time, a.last_access_time, b.last_access_time, c.last_access_time = 0, 5, 6, 3
    assert _evict_order(cache, 2) == [9, 3]  # C, then A (oldest leaf), not U (inner)
    assert cache.evict(100) == 5  # B, then U once it has no children
    assert not cache.root.children and cache.allocator.available_size() == 256


def test_evict_stops_as_soon_as_enough_is_freed() -> None:
    cache = make_cache()
    for first in (10, 20, 30):
        put(cache, [first, first + 1, first + 2])
    assert cache.evict(4) == 4  # one whole leaf, then one token of the next victim
    assert cache.evictable_size() == 5
    assert cache.allocator.available_size() == 256 - 5


def test_the_last_victim_keeps_its_head_as_a_cached_prefix() -> None:
    cache = make_cache()
    put(cache, [1, 2, 3, 4, 5, 6])
    _, slots = put(cache, [9, 8, 7])
    cache.match_prefix([9, 8, 7])  # [1..6] is now the least recently used leaf
    assert cache.evict(2) == 2
    head = cache.match_prefix([1, 2, 3, 4, 5, 6])
    assert head.indices.numel() == 4 and head.last_node.key == [1, 2, 3, 4]
    assert cache.match_prefix([9, 8, 7]).indices.tolist() == slots.tolist()  # untouched
    assert cache.allocator.available_size() + cached_size(cache) == 256


def test_trimming_is_page_aligned() -> None:
    cache = make_cache(page_size=4)
    put(cache, list(range(100, 112)))  # three pages
    assert cache.evict(5) == 8  # 5 tokens round up to two pages
    head = cache.match_prefix(list(range(100, 112)))
    assert head.indices.numel() == 4
    assert cache.allocator.available_size() == 256 - 4


@pytest.mark.parametrize(
    ("policy", "order"), [("lru", [20, 30, 10]), ("lfu", [30, 10, 20]), ("fifo", [10, 30, 20])]
)
def test_eviction_order_follows_the_policy(policy: str, order: list[int]) -> None:
    cache = make_cache(policy=policy)
    x, y, z = _three_leaves(cache)
    x.last_access_time, y.last_access_time, z.last_access_time = 3.0, 1.0, 2.0
    x.hit_count, y.hit_count, z.hit_count = 1, 5, 1  # lfu: x/z tie broken by access time
    x.creation_time, y.creation_time, z.creation_time = 1.0, 3.0, 2.0
    assert _evict_order(cache, 3) == order


@pytest.mark.parametrize(("policy", "first_out"), [("lru", 1), ("lfu", 3), ("fifo", 1)])
def test_eviction_order_from_real_inserts_and_matches(policy: str, first_out: int) -> None:
    cache = make_cache(policy=policy)
    put(cache, [1, 2])
    time.sleep(0.002)
    put(cache, [3, 4])
    cache.match_prefix([1, 2])
    cache.match_prefix([1, 2])
    time.sleep(0.002)
    cache.match_prefix([3, 4])  # lru: [1,2] is older; lfu: [3,4] has fewer hits
    assert _evict_order(cache, 1) == [first_out]


def test_fifo_split_prefix_keeps_its_creation_time() -> None:
    cache = make_cache(policy="fifo")
    put(cache, [1, 2, 3, 4])
    time.sleep(0.002)
    put(cache, [9])
    time.sleep(0.002)
    cache.match_prefix([1, 2])  # splits [1,2,3,4]; both halves were inserted first
    assert _evict_order(cache, 3) == [3, 1, 9]


def test_unknown_eviction_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown"):
        make_cache(policy="random")


def test_reset_empties_the_tree() -> None:
    cache = make_cache()
    _, _, b = fork(cache)
    cache.inc_lock_ref(b)
    cache.reset()
    assert not cache.root.children
    assert (cache.evictable_size(), cache.protected_size()) == (0, 0)
    assert cache.match_prefix([1, 2, 3, 4]).indices.numel() == 0


POOL = 64
toks = st.lists(st.integers(0, 2), min_size=1, max_size=16)  # tiny alphabet: shared prefixes
ops = st.lists(
    st.tuples(st.sampled_from(["insert", "lock", "match"]), toks)
    | st.tuples(st.just("unlock"), st.integers(0, 99))
    | st.tuples(st.just("evict"), st.integers(1, 24)),
    max_size=40,
)


def check_invariant(cache: RadixCache) -> None:
    nodes = tree_nodes(cache)
    assert cache.allocator.available_size() + cached_size(cache) == POOL
    assert sum(len(n.key) for n in nodes) == cached_size(cache)
    assert sum(len(n.key) for n in nodes if n.lock_ref) == cache.protected_size()
    slots = torch.cat([cache.root.value, *(n.value for n in nodes)])
    assert slots.unique().numel() == slots.numel()


def apply(cache: RadixCache, locks: list[TreeNode], op: str, arg: object) -> None:
    if op == "insert":
        key = list(arg)[: len(arg) // cache.page_size * cache.page_size]
        cache.evict(max(0, len(key) - cache.allocator.available_size()))
        if key and cache.allocator.available_size() >= len(key):
            put(cache, key)
    elif op in ("lock", "match"):
        node = cache.match_prefix(list(arg)).last_node
        if op == "lock" and node is not cache.root:
            cache.inc_lock_ref(node)
            locks.append(node)
    elif op == "unlock" and locks:
        cache.dec_lock_ref(locks.pop(arg % len(locks)))
    elif op == "evict":
        assert cache.evict(arg) >= min(arg, cache.evictable_size())


@pytest.mark.parametrize("page_size", [1, 4])
@settings(max_examples=150, deadline=None)
@given(seq=ops)
def test_pool_invariant_holds_under_random_operations(page_size: int, seq: list) -> None:
    cache = make_cache(page_size=page_size, pool=POOL)
    locks: list[TreeNode] = []
    for op, arg in seq:
        apply(cache, locks, op, arg)
        check_invariant(cache)
    for node in locks:
        cache.dec_lock_ref(node)
    cache.evict(POOL)
    assert cache.allocator.available_size() == POOL and not cache.root.children
