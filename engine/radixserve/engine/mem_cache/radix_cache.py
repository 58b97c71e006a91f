"""RadixCache: a token-keyed radix tree over KV slots, shared across requests.

Nodes hold a key segment (token ids) and the KV slots of those tokens. Child key: the first
token (page size 1) or the first page as a tuple. With page size > 1 every key and split is
page-aligned. `lock_ref` counts requests pinning a node (and thus its ancestors); unlocked
leaves are evicted lazily when the allocator runs dry, in eviction-policy order; the last
victim of an eviction loses only the tail it must give up (its head stays a cached prefix).
Invariant (checked when idle): allocator free + evictable + protected = pool size.
`peek_prefix` only reads (for ordering waiting requests); `match_prefix` is for admission: it
splits so the match ends on a node boundary (the node to lock) and counts a hit on its path.

Events: every newly inserted page → BlockStored (chained by parent hash), every evicted page
→ BlockRemoved, `reset` → AllBlocksCleared; a split changes no page and emits nothing.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections.abc import Iterator

import torch

from radixserve.engine.mem_cache.allocator import BaseTokenAllocator
from radixserve.engine.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    CachedReq,
    MatchResult,
    PrefixPeek,
)
from radixserve.engine.mem_cache.evict_policy import eviction_key
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.tree_node import TreeNode
from radixserve.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KVCacheEvent
from radixserve.protocol.block_hash import digest_to_int64, hash_pages


class RadixCache(BasePrefixCache):
    def __init__(  # noqa: PLR0913 - the cache binds pools, paging, policy and events
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: BaseTokenAllocator,
        page_size: int = 1,
        eviction_policy: str = "lru",
        enable_events: bool = False,
    ) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator
        self.page_size = page_size
        self.eviction_policy = eviction_policy
        eviction_key(eviction_policy, TreeNode(0))  # fail fast on an unknown policy name
        self.enable_events = enable_events
        self.track_digests = enable_events  # page hashes: for events (and a storage tier's keys)
        self._ids = itertools.count(1)
        self.events: list[KVCacheEvent] = []
        self.reset()

    # ---- bookkeeping ------------------------------------------------------------------------

    def reset(self) -> None:
        self.root = TreeNode(0)
        self.root.lock_ref = 1
        self._evictable = 0
        self._protected = 0
        if self.enable_events:
            self.events.append(AllBlocksCleared())

    def take_events(self) -> list[KVCacheEvent]:
        events, self.events = self.events, []
        return events

    def evictable_size(self) -> int:
        return self._evictable

    def protected_size(self) -> int:
        return self._protected

    def cached_page_hashes(self) -> list[int]:
        """Event hashes (int64) of every page in the tree, for mirrors to compare against
        (empty when events are off: pages are hashed only for the event stream)."""
        return sorted(digest_to_int64(d) for n in self._nodes() for d in n.page_digests)

    def _nodes(self, top: TreeNode | None = None) -> Iterator[TreeNode]:
        """`top` (default: the root, which holds nothing) and every node below it."""
        stack = [self.root if top is None else top]
        while stack:
            node = stack.pop()
            yield node
            stack.extend(node.children.values())

    def _child_key(self, key: list[int]) -> int | tuple[int, ...]:
        return key[0] if self.page_size == 1 else tuple(key[: self.page_size])

    def _match_len(self, a: list[int], b: list[int]) -> int:
        n = 0
        for x, y in zip(a, b, strict=False):
            if x != y:
                break
            n += 1
        return n // self.page_size * self.page_size

    # ---- match / insert -----------------------------------------------------------------------

    def match_prefix(self, key: list[int]) -> MatchResult:
        """Admission match: splits so the match ends on a node, counts a hit on its path."""
        return self._match(key, count_hit=True)

    def lock_span(self, peek: PrefixPeek) -> PrefixPeek:
        """What locking `peek.node` protects: the whole chain down to that node's end (the
        match may end inside it), so a waiting request can be pinned without a split."""
        node, depth = peek.node, 0
        while node is not None and node is not self.root:
            depth += len(node.key)
            node = node.parent
        return PrefixPeek(depth, peek.node)

    def _match(self, key: list[int], count_hit: bool) -> MatchResult:
        key = key[: len(key) // self.page_size * self.page_size]
        node, values = self.root, []
        now = time.monotonic()
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.last_access_time = now
            if count_hit:
                child.hit_count += 1
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
                values.append(child.value)
                node = child
                break
            values.append(child.value)
            node, key = child, key[n:]
        indices = torch.cat(values) if values else self._no_slots()
        return MatchResult(indices, node)

    def peek_prefix(self, key: list[int]) -> PrefixPeek:
        key = key[: len(key) // self.page_size * self.page_size]
        node, length = self.root, 0
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            n = self._match_len(child.key, key)
            node, length = child, length + n
            if n < len(child.key):
                break
            key = key[n:]
        return PrefixPeek(length, node)

    def evictable_in_match(self, peek: PrefixPeek) -> int:
        # Walk up from the peeked node: a split since the peek inserted nodes above it but
        # moved no matched token below it, so the chain still covers the whole match.
        chain: list[TreeNode] = []
        node = peek.node
        while node is not None and node is not self.root:
            chain.append(node)
            node = node.parent
        start = total = 0
        for node in reversed(chain):
            if start >= peek.length:
                break
            if node.lock_ref == 0:
                total += min(len(node.key), peek.length - start)
            start += len(node.key)
        return total

    def _no_slots(self) -> torch.Tensor:
        return torch.empty(0, dtype=torch.int64, device=self.allocator.device)

    def insert(self, key: list[int], value: torch.Tensor) -> int:
        """Insert key → value (page-aligned lengths); returns how many leading tokens were
        already cached (their slots in `value` are duplicates the caller must free)."""
        node, prefix, counting = self.root, 0, True
        now = time.monotonic()
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            child.last_access_time = now
            n = self._match_len(child.key, key)
            if n < len(child.key):
                child = self._split_node(child, n)
            held = self._holds(child, value[:n])
            counting = counting and held
            prefix += n if counting else 0
            node, key, value = child, key[n:], value[n:]
        if key:
            self._add_leaf(node, key, value.clone())
        return prefix

    def _holds(self, node: TreeNode, slots: torch.Tensor) -> bool:
        """Insert met `node` on its way: True when the node holds these tokens' KV already
        (the caller's `slots` for them are duplicates); a tiered cache may instead give an
        evicted node the caller's slots and answer False."""
        return True

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> TreeNode:
        leaf = TreeNode(next(self._ids), parent=parent, key=list(key), value=value)
        parent.children[self._child_key(key)] = leaf
        self._evictable += len(key)
        if self.track_digests:  # hashes exist only for events and storage keys: none without
            leaf.page_digests = hash_pages(leaf.key, self.page_size, parent.last_digest())
        if self.enable_events:
            self._record_stored(leaf)
        return leaf

    def _split_node(self, child: TreeNode, n: int) -> TreeNode:
        """child → new (key[:n]) → child (key[n:]); returns the new upper node."""
        pages = n // self.page_size
        upper = TreeNode(
            next(self._ids), parent=child.parent, key=child.key[:n], value=child.value[:n]
        )
        upper.lock_ref = child.lock_ref
        upper.last_access_time = child.last_access_time
        upper.creation_time = child.creation_time
        upper.hit_count = child.hit_count
        upper.page_digests = child.page_digests[:pages]
        upper.children = {self._child_key(child.key[n:]): child}
        assert child.parent is not None
        child.parent.children[self._child_key(child.key)] = upper
        child.parent = upper
        child.key, child.value = child.key[n:], child.value[n:]
        child.page_digests = child.page_digests[pages:]
        return upper

    # ---- locks / eviction ---------------------------------------------------------------------

    def inc_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 0:
                self._evictable -= len(node.key)
                self._protected += len(node.key)
            node.lock_ref += 1
            node = node.parent

    def dec_lock_ref(self, node: TreeNode | None) -> None:
        while node is not None and node is not self.root:
            if node.lock_ref == 1:
                self._evictable += len(node.key)
                self._protected -= len(node.key)
            node.lock_ref -= 1
            node = node.parent

    def evict(self, num_tokens: int) -> int:
        heap = [(eviction_key(self.eviction_policy, n), n.id, n) for n in self._evictable_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            rest = -(-(num_tokens - freed) // self.page_size) * self.page_size
            if rest < len(leaf.key):  # the last victim: drop only its tail, keep its head
                freed += self._trim_leaf(leaf, len(leaf.key) - rest)
                break
            self.allocator.free(leaf.value)
            freed += len(leaf.key)
            self._evictable -= len(leaf.key)
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key)]
            if self.enable_events:
                self.events.extend(BlockRemoved([digest_to_int64(d)]) for d in leaf.page_digests)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(
                    heap, (eviction_key(self.eviction_policy, parent), parent.id, parent)
                )
        return freed

    def _trim_leaf(self, leaf: TreeNode, keep: int) -> int:
        """Free the tail of an unlocked leaf beyond `keep` tokens (page-aligned, 0 < keep <
        len): its head stays cached and keeps its place in the eviction order."""
        self.allocator.free(leaf.value[keep:])
        pages = keep // self.page_size
        if self.enable_events:
            self.events.extend(
                BlockRemoved([digest_to_int64(d)]) for d in leaf.page_digests[pages:]
            )
        trimmed = len(leaf.key) - keep
        leaf.key, leaf.value = leaf.key[:keep], leaf.value[:keep]
        leaf.page_digests = leaf.page_digests[:pages]
        self._evictable -= trimmed
        return trimmed

    def _evictable_leaves(self) -> list[TreeNode]:
        return [
            n for n in self._nodes() if not n.children and n is not self.root and n.lock_ref == 0
        ]

    def _record_stored(self, leaf: TreeNode, medium: str | None = None) -> None:
        assert leaf.parent is not None
        parent_digest = leaf.parent.last_digest()
        ps = self.page_size
        for i, digest in enumerate(leaf.page_digests):
            parent_hash = digest_to_int64(parent_digest) if parent_digest is not None else None
            tokens = leaf.key[i * ps : (i + 1) * ps]
            self.events.append(
                BlockStored([digest_to_int64(digest)], parent_hash, tokens, ps, medium=medium)
            )
            parent_digest = digest

    # ---- request hand-over --------------------------------------------------------------------

    def cache_unfinished_req(self, req: CachedReq) -> None:
        assert req.req_pool_idx is not None
        row = req.req_pool_idx
        ids = req.fill_ids
        kv = self.req_to_token_pool.req_to_token[row, : len(ids)].to(torch.int64).clone()
        aligned = len(ids) // self.page_size * self.page_size
        new_prefix = self.insert(ids[:aligned], kv[:aligned])
        self.allocator.free(kv[req.cache_protected_len : new_prefix])
        match = self._match(ids[:aligned], count_hit=False)  # the request's own pages: no hit
        tree_kv = match.indices
        self.req_to_token_pool.write(
            row, req.cache_protected_len, tree_kv[req.cache_protected_len :]
        )
        self.dec_lock_ref(req.last_node)
        self.inc_lock_ref(match.last_node)
        req.prefix_indices = torch.cat((tree_kv, kv[len(tree_kv) :]))
        req.last_node = match.last_node
        req.cache_protected_len = len(tree_kv)

    def cache_finished_req(self, req: CachedReq, is_insert: bool = True) -> None:
        assert req.req_pool_idx is not None
        kv_len = req.kv_allocated_len
        kv = self.req_to_token_pool.req_to_token[req.req_pool_idx, :kv_len].to(torch.int64).clone()
        if is_insert:
            # The last sampled token's KV is not part of the request's committed state (under
            # overlap an extra step may have computed it); insert what precedes it, free the rest.
            committed = min(kv_len, len(req.full_ids()) - 1)
            aligned = committed // self.page_size * self.page_size
            new_prefix = self.insert(req.full_ids()[:aligned], kv[:aligned])
            self.allocator.free(kv[req.cache_protected_len : new_prefix])
            self.allocator.free(kv[aligned:])
        else:
            self.allocator.free(kv[req.cache_protected_len :])
        self.req_to_token_pool.free(req.req_pool_idx)
        self.dec_lock_ref(req.last_node)
        req.req_pool_idx = None
        req.last_node = None
