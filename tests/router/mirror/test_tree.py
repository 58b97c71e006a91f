"""MirrorTree: fed the engine RadixCache's own events, it matches exactly what the engine's
cache matches (through inserts, evictions, locks, resets, at page sizes 1/4/16); plus orphans,
subtree removal and malformed events."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.protocol import AllBlocksCleared, BlockRemoved, BlockStored, block_hashes
from radixserve.router.mirror.tree import MirrorTree
from tests.router.mirror.replica import cache_insert, engine_match, make_cache


def feed(cache: RadixCache, mirror: MirrorTree) -> None:
    for event in cache.take_events():
        mirror.apply(event)


def assert_mirrors(cache: RadixCache, mirror: MirrorTree, queries: list[list[int]]) -> None:
    mirror.check_invariants()
    assert mirror.cached_hashes() == cache.cached_page_hashes()
    assert mirror.num_tokens == (cache.evictable_size() + cache.protected_size())
    assert mirror.num_orphans == 0
    for q in queries:
        assert mirror.match_prefix(q) == engine_match(cache, q), q


def ops(page_size: int) -> st.SearchStrategy:
    tokens = st.lists(st.integers(0, 2), min_size=1, max_size=6 * page_size)
    return st.lists(
        st.one_of(
            st.tuples(st.just("insert"), tokens),
            st.tuples(st.just("lock"), tokens),
            st.tuples(st.just("query"), tokens),
            st.tuples(st.just("evict"), st.integers(1, 8 * page_size)),
            st.tuples(st.just("reset"), st.none()),
        ),
        max_size=40,
    )


def run_ops(page_size: int, seq: list) -> None:
    cache = make_cache(page_size, pool=12 * page_size)
    mirror = MirrorTree(page_size)
    feed(cache, mirror)
    queries: list[list[int]] = []
    for op, arg in seq:
        if op == "insert":
            cache_insert(cache, arg)
        elif op == "lock":
            cache.inc_lock_ref(cache.match_prefix(arg).last_node)
        elif op == "evict":
            cache.evict(arg)
        elif op == "reset":
            cache.reset()
            cache.allocator.clear()
        if arg and op != "evict":
            queries += [arg, [*arg, 9], arg[:-1] + [9]]
        feed(cache, mirror)
        assert_mirrors(cache, mirror, queries[-30:])


@settings(max_examples=120, deadline=None)
@given(seq=ops(1))
def test_mirror_matches_engine_cache_page_1(seq: list) -> None:
    run_ops(1, seq)


@settings(max_examples=80, deadline=None)
@given(seq=ops(4))
def test_mirror_matches_engine_cache_page_4(seq: list) -> None:
    run_ops(4, seq)


@settings(max_examples=40, deadline=None)
@given(seq=ops(16))
def test_mirror_matches_engine_cache_page_16(seq: list) -> None:
    run_ops(16, seq)


@pytest.mark.parametrize("page_size", [1, 16])
def test_mirror_matches_engine_at_scale(page_size: int) -> None:
    """Prompts of 700–2000 tokens sharing system prompts, a pool that forces evictions."""
    rng = random.Random(page_size)
    systems = [[rng.randrange(50_000) for _ in range(rng.randrange(100, 600))] for _ in range(6)]
    cache = make_cache(page_size, pool=40_000)
    mirror = MirrorTree(page_size)
    prompts = []
    for _ in range(60):
        tail = [rng.randrange(50_000) for _ in range(rng.randrange(600, 1400))]
        prompts.append(rng.choice(systems) + tail)
        cache_insert(cache, prompts[-1])
        feed(cache, mirror)
    assert (
        cache.evictable_size() + cache.protected_size()
    ) > 30_000  # evictions happened and the pool is full
    probes = [p[: rng.randrange(1, len(p))] + [7] for p in prompts[-20:]]
    assert_mirrors(cache, mirror, prompts + probes + systems)


# ---- hand-made events (the tree trusts no hash scheme: any int names a block) ----------------


class BlockSetModel:
    """The plainest reading of the events: a set of blocks; the tree is what hangs from the
    root through stored parents; removing a block takes what hangs below it."""

    def __init__(self) -> None:
        self.blocks: dict[int, tuple[int | None, tuple[int, ...]]] = {}

    def reachable(self) -> set[int]:
        memo: dict[int, bool] = {}

        def ok(h: int | None) -> bool:
            if h is None:
                return True
            if h not in memo:
                memo[h] = h in self.blocks and ok(self.blocks[h][0])
            return memo[h]

        return {h for h in self.blocks if ok(h)}

    def remove(self, h: int) -> None:
        live = self.reachable()
        if h not in live:
            self.blocks.pop(h, None)
            return
        gone, changed = {h}, True
        while changed:
            more = {x for x in live if self.blocks[x][0] in gone} - gone
            gone |= more
            changed = bool(more)
        for x in gone:
            del self.blocks[x]

    def match(self, tokens: list[int], page_size: int) -> int:
        live = self.reachable()
        index = {(p, page): h for h, (p, page) in self.blocks.items() if h in live}
        cur, n = None, 0
        for i in range(0, len(tokens) - page_size + 1, page_size):
            cur = index.get((cur, tuple(tokens[i : i + page_size])))
            if cur is None:
                break
            n += page_size
        return n


def path_blocks(path: list[int], page_size: int) -> list[tuple[int, int | None, list[int]]]:
    """(hash, parent hash, page) of each full page; the hash is a function of (parent, page),
    so equal prefixes name equal blocks, as with a real chained hash."""
    out, parent = [], None
    for i in range(0, len(path) - page_size + 1, page_size):
        page = path[i : i + page_size]
        h = hash((parent, tuple(page)))
        out.append((h, parent, page))
        parent = h
    return out


@st.composite
def shared_paths(draw: st.DrawFn) -> list[list[int]]:
    """A base path and up to three branches off it at random points."""
    base = draw(st.lists(st.integers(0, 2), min_size=4, max_size=16))
    out = [base]
    for _ in range(draw(st.integers(1, 3))):
        cut = draw(st.integers(0, len(base)))
        out.append(base[:cut] + draw(st.lists(st.integers(0, 2), min_size=2, max_size=8)))
    return out


block_ops = st.lists(
    st.tuples(
        st.sampled_from(["chain", "chain", "store", "remove", "remove_tail", "clear"]),
        st.integers(0, 3),
        st.integers(0, 15),
    ),
    min_size=8,
    max_size=60,
)


@pytest.mark.parametrize("page_size", [1, 2])
@settings(max_examples=150, deadline=None)
@given(paths=shared_paths(), seq=block_ops)
def test_mirror_matches_a_block_set_model_any_event_order(
    page_size: int, paths: list[list[int]], seq: list
) -> None:
    """Chains stored in order (splits, merges), single blocks out of order (orphans), inner
    blocks removed (subtrees), tails removed first-to-last (as the engine does), clears."""
    t, model = MirrorTree(page_size, max_orphans=10_000), BlockSetModel()
    queries = [q for p in paths for q in (p, [*p, 9], p[: len(p) // 2] + [9])]
    for op, pi, i in seq:
        blocks = path_blocks(paths[pi % len(paths)], page_size)
        i %= len(blocks)
        if op == "clear":
            t.apply(AllBlocksCleared())
            model.blocks.clear()
        elif op in ("chain", "store"):
            for h, parent, page in blocks[: i + 1] if op == "chain" else [blocks[i]]:
                t.apply(BlockStored([h], parent, page, page_size))
                model.blocks.setdefault(h, (parent, tuple(page)))
        else:
            for h, _, _ in blocks[i:] if op == "remove_tail" else [blocks[i]]:
                t.apply(BlockRemoved([h]))
                model.remove(h)
        t.check_invariants()
        live = model.reachable()
        assert t.cached_hashes() == sorted(live)
        assert t.num_orphans == len(model.blocks) - len(live)
        for q in queries:
            assert t.match_prefix(q) == model.match(q, page_size)


def stored(h: int, parent: int | None, tokens: list[int], page_size: int = 1) -> BlockStored:
    return BlockStored([h], parent, tokens, page_size)


def test_orphan_waits_for_its_parent() -> None:
    t = MirrorTree(1)
    t.apply(stored(3, 2, [30]))
    t.apply(stored(2, 1, [20]))
    assert (t.num_orphans, t.num_blocks, t.match_prefix([10, 20, 30])) == (2, 0, 0)
    t.apply(stored(1, None, [10]))
    assert (t.num_orphans, t.num_blocks, t.match_prefix([10, 20, 30, 40])) == (0, 3, 3)
    t.check_invariants()


def test_orphans_are_bounded_oldest_dropped_first() -> None:
    t = MirrorTree(1, max_orphans=2)
    t.apply(stored(11, 1, [11]))
    t.apply(stored(12, 1, [12]))
    t.apply(stored(13, 1, [13]))  # drops orphan 11
    assert t.num_orphans == 2
    t.apply(stored(1, None, [1]))
    assert [t.match_prefix([1, x]) for x in (11, 12, 13)] == [1, 2, 2]
    t.check_invariants()


def test_removed_orphan_is_never_attached() -> None:
    t = MirrorTree(1)
    t.apply(stored(2, 1, [20]))
    t.apply(BlockRemoved([2]))
    t.apply(stored(1, None, [10]))
    assert (t.num_orphans, t.match_prefix([10, 20])) == (0, 1)


def test_all_blocks_cleared_drops_orphans_too() -> None:
    t = MirrorTree(1)
    t.apply(stored(1, None, [10]))
    t.apply(stored(3, 2, [30]))
    t.apply(AllBlocksCleared())
    assert (t.num_blocks, t.num_orphans, t.match_prefix([10])) == (0, 0, 0)


def test_removing_an_inner_block_drops_its_subtree() -> None:
    t = MirrorTree(1)
    for h, parent, tok in [(1, None, 1), (2, 1, 2), (3, 2, 3), (4, 3, 4), (5, 2, 5), (6, 5, 6)]:
        t.apply(stored(h, parent, [tok]))
    assert t.match_prefix([1, 2, 3, 4]) == 4 and t.match_prefix([1, 2, 5, 6]) == 4
    t.apply(BlockRemoved([2]))
    assert (t.num_blocks, t.match_prefix([1, 2, 3, 4]), t.match_prefix([1, 2, 5])) == (1, 1, 1)
    t.apply(BlockRemoved([3, 6]))  # already gone with block 2: ignored
    t.apply(stored(2, 1, [2]))
    assert t.match_prefix([1, 2, 3]) == 2
    t.check_invariants()


def test_removing_mid_chain_truncates_and_a_branch_merges_back() -> None:
    t = MirrorTree(1)
    hashes = block_hashes([1, 2, 3, 4, 5], 1)
    parents = [None, *hashes[:-1]]
    for h, parent, tok in zip(hashes, parents, [1, 2, 3, 4, 5], strict=True):
        t.apply(stored(h, parent, [tok]))
    t.apply(stored(99, hashes[1], [7]))  # branch after [1, 2]: splits the chain
    assert t.match_prefix([1, 2, 7]) == 3
    t.apply(BlockRemoved([99]))  # the chain is one node again
    t.check_invariants()
    t.apply(BlockRemoved([hashes[2]]))
    assert (t.num_blocks, t.match_prefix([1, 2, 3, 4, 5])) == (2, 2)
    t.check_invariants()


def chain(t: MirrorTree, tokens: list[int], parent: int | None = None) -> list[int]:
    """Store tokens as one block per token below `parent`; the block hash is the token."""
    for tok in tokens:
        t.apply(stored(tok, parent, [tok]))
        parent = tok
    return tokens


def test_split_and_merge_move_children_with_their_node() -> None:
    t = MirrorTree(1)
    stem = chain(t, list(range(1, 11)))
    chain(t, [21, 22], parent=10)
    chain(t, [31, 32], parent=10)  # stem (10 pages) with two branches at its end
    chain(t, [41], parent=8)  # split late in the stem: the short tail takes the branches
    t.check_invariants()
    assert [t.match_prefix([*stem, b, b + 1]) for b in (21, 31)] == [12, 12]
    assert t.match_prefix([*stem[:8], 41]) == 9
    t.apply(BlockRemoved([41]))  # the stem merges again, taking the branches back
    t.check_invariants()
    assert [t.match_prefix([*stem, b, b + 1]) for b in (21, 31)] == [12, 12]
    assert t.num_blocks == 14


def test_duplicates_and_conflicts_keep_the_first_block() -> None:
    t = MirrorTree(2)
    t.apply(BlockStored([1], None, [5, 6], 2))
    t.apply(BlockStored([1], None, [5, 6], 2))  # same block again
    t.apply(BlockStored([2], None, [5, 6], 2))  # same tokens at the same place, other hash
    assert (t.num_blocks, t.match_prefix([5, 6, 7])) == (1, 2)
    t.apply(BlockRemoved([2]))  # unknown hash: nothing happens
    assert t.num_blocks == 1
    t.apply(BlockStored([3], 1, [7, 8], 2))
    t.apply(BlockStored([4], 3, [9, 9], 2))
    t.apply(BlockStored([5], 1, [7, 8], 2))  # the same, mid-node: no split either
    assert (t.num_blocks, t.match_prefix([5, 6, 7, 8, 9, 9])) == (3, 6)
    t.check_invariants()


def test_multi_block_event_is_a_chain_of_pages() -> None:
    t = MirrorTree(2)
    t.apply(BlockStored([1, 2, 3], None, [1, 2, 3, 4, 5, 6], 2))
    assert (t.num_blocks, t.match_prefix([1, 2, 3, 4, 5])) == (3, 4)
    t.apply(BlockRemoved([2]))
    assert t.match_prefix([1, 2, 3, 4, 5, 6]) == 2


def test_partial_pages_never_match() -> None:
    t = MirrorTree(4)
    t.apply(BlockStored([1], None, [1, 2, 3, 4], 4))
    t.apply(BlockStored([2], 1, [5, 6, 7, 8], 4))
    assert [t.match_prefix(list(range(1, n + 1))) for n in (3, 4, 7, 8, 9)] == [0, 4, 4, 8, 8]
    assert t.match_prefix([1, 2, 3, 4, 5, 6, 7, 9]) == 4


@pytest.mark.parametrize(
    ("event", "field"),
    [
        (BlockStored([1], None, [1, 2], 2), "block_size"),
        (BlockStored([1], None, [1, 2, 3], 4), "token_ids"),
        (BlockStored([1], None, [-1, 2, 3, 4], 4), "token_ids"),
        (BlockStored([1, 2], None, [1, 2, 3, 4], 4), "token_ids"),
    ],
)
def test_malformed_block_stored_names_the_field(event: BlockStored, field: str) -> None:
    t = MirrorTree(4)
    with pytest.raises(ValueError, match=field):
        t.apply(event)
    assert t.num_blocks == 0


def test_bad_page_size_names_the_field() -> None:
    with pytest.raises(ValueError, match="page_size"):
        MirrorTree(0)
    with pytest.raises(ValueError, match="max_orphans"):
        MirrorTree(1, max_orphans=-1)
