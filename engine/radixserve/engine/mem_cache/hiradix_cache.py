"""HiRadixCache: the radix cache over three tiers, device pool → host pool → storage (HiCache).

A node's KV lives on the device (`value`), in the host pool (`host_value`), or both. Tiers:
- **device → host.** Evicting a device leaf *demotes* it: it is copied to host if it has no
  copy yet (under `write_through_selective` only if it was hit twice), its device slots go back
  to the allocator and the node stays in the tree, host-only (`evicted`). A leaf that gets no
  copy (the host had no room) is dropped with the host-only nodes below it.
- **Host room.** A copy that needs room first drops the host copies of nodes still on the
  device (oldest first), then host-only leaves: the host keeps what the device does not.
- **Writes to host** follow `--hicache-write-policy`: `write_through` copies a node when it is
  inserted, `write_through_selective` when a match has counted its second hit, `write_back`
  only when it is evicted.
- **host → storage.** Every page copied to host is also queued for the storage backend (one
  writer thread), so other replicas can read it; evicting a host-only leaf frees its host
  slots (re-queueing a page the storage has lost since). Storage is not mirrored in the tree.
- **storage → host** (`prefetch`, hicache_prefetch.py): a waiting request's pages past the
  tree's end are read by chain hash on a reader thread; when the prefetch policy lets the
  request go (`prefetch_ready`), the pages that landed become a host-only node under the
  tree's match.
- **Load-back.** `match_prefix` walks device, then host-only nodes, and copies the host part
  into fresh device slots before returning, so the request sees one device prefix and counts
  it as cached. All or nothing: without device room the host part is recomputed. On a CPU
  engine the copies are memcpy on the scheduler thread (≈10 µs a token, docs/hicache.md).

Invariants: the descendants of an evicted node are evicted; an evicted node has a host copy
and no lock; `_evictable`/`_protected` count device tokens only. Under TP every rank keeps its
own heads in its own pools, and the ranks agree on how many prefetched pages a request
takes (`agree_min`), since reads and writes land at different times.

Events (medium per tier, SGLang's names; the device tier keeps "GPU" on a CPU engine too):
BlockStored/BlockRemoved with medium GPU when device pages appear or go, CPU_PINNED when host
copies do, the backend's medium (DISK for files, EXTERNAL for a Mooncake store) when pages are
queued for storage or the storage deleted them (for whichever
replica wrote them: replicas that share a storage id share one storage mirror in the router).
"""

from __future__ import annotations

import heapq
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from radixserve.engine.mem_cache.allocator import BaseTokenAllocator
from radixserve.engine.mem_cache.base_prefix_cache import MatchResult, PrefixPeek
from radixserve.engine.mem_cache.evict_policy import eviction_key
from radixserve.engine.mem_cache.hicache_prefetch import (
    NOT_YET,
    PrefetchConfig,
    PrefetchOp,
    StoragePrefetcher,
)
from radixserve.engine.mem_cache.hicache_storage import HiCacheStorage
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from radixserve.engine.mem_cache.memory_pool_host import HostKVPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.mem_cache.tree_node import TreeNode
from radixserve.protocol import BlockRemoved, KVCacheEvent
from radixserve.protocol.block_hash import digest_to_int64, hash_pages

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
MEDIUM_DEVICE = "GPU"
MEDIUM_HOST = "CPU_PINNED"


@dataclass(slots=True)
class HiCacheStats:
    """Counters since start (tokens unless named otherwise); owned by one cache."""

    device_hit_tokens: int = 0
    host_hit_tokens: int = 0
    storage_hit_tokens: int = 0
    load_back_tokens: int = 0
    load_back_bytes: int = 0
    load_back_seconds: float = 0.0
    backup_tokens: int = 0
    dropped_tokens: int = 0
    storage_written_pages: int = 0
    prefetch_tokens: int = 0  # read from storage and attached as host nodes
    prefetch_deferrals: int = 0  # admission rounds a request skipped, its prefetch unfinished
    prefetch_lost_tokens: int = 0  # read, then dropped: the tree lost their prefix meanwhile


@dataclass(frozen=True, slots=True)
class HiCacheConfig:
    host_size: int  # tokens
    write_policy: str = "write_through"
    storage: HiCacheStorage | None = None
    prefetch: PrefetchConfig = PrefetchConfig()
    agree_min: Callable[[int], int] | None = None  # TP: the smallest value over the ranks


class HiRadixCache(RadixCache):
    def __init__(  # noqa: PLR0913 - the radix cache's bindings plus the tiers
        self,
        req_to_token_pool: ReqToTokenPool,
        allocator: BaseTokenAllocator,
        device_pool: MHATokenToKVPool,
        config: HiCacheConfig,
        page_size: int = 1,
        eviction_policy: str = "lru",
        enable_events: bool = False,
    ) -> None:
        if config.write_policy not in WRITE_POLICIES:
            raise ValueError(f"hicache_write_policy: unknown {config.write_policy!r}")
        self.host = HostKVPool(device_pool, config.host_size)
        self.config = config
        self.storage = config.storage
        self.write_threshold = 1 if config.write_policy == "write_through" else 2
        self.stats = HiCacheStats()
        self.prefetcher: StoragePrefetcher | None = None
        if self.storage is not None:
            page_bytes = page_size * self.host.bytes_per_token()
            self.prefetcher = StoragePrefetcher(
                self.storage,
                config.prefetch,
                page_size,
                page_bytes,
                max(self.host.size * self.host.bytes_per_token() // 2, page_bytes),
            )
        self.prefetches = self.prefetcher is not None
        self._prefetches: dict[str, PrefetchOp] = {}  # by request id
        self._from_storage: set[int] = set()  # ids of host nodes prefetched, not loaded yet
        super().__init__(req_to_token_pool, allocator, page_size, eviction_policy, enable_events)
        self.track_digests = enable_events or self.storage is not None

    def reset(self) -> None:
        self.drop_prefetches(set())
        super().reset()
        self.host.clear()
        self._from_storage.clear()

    def close(self) -> None:
        if self.prefetcher is not None:
            self.prefetcher.close()
        if self.storage is not None:
            self.storage.close()

    def _record_stored(self, leaf: TreeNode, medium: str | None = MEDIUM_DEVICE) -> None:
        super()._record_stored(leaf, medium)

    def _agree(self, n: int) -> int:
        return n if self.config.agree_min is None else self.config.agree_min(n)

    # ---- match: device, then host, then storage; load back what is not on the device ----------

    def peek_prefix(self, key: list[int]) -> PrefixPeek:
        """The device-resident match only: what admission may count on without a copy."""
        key = key[: len(key) // self.page_size * self.page_size]
        node, length = self.root, 0
        while key:
            child = node.children.get(self._child_key(key))
            if child is None or child.evicted:
                break
            n = self._match_len(child.key, key)
            node, length = child, length + n
            if n < len(child.key):
                break
            key = key[n:]
        return PrefixPeek(length, node)

    def match_prefix(self, key: list[int]) -> MatchResult:
        key = key[: len(key) // self.page_size * self.page_size]
        path = self._walk(key)
        on_device = [n for n in path if not n.evicted]
        on_host = path[len(on_device) :]
        for node in on_host:  # the device eviction below must not drop them
            node.host_lock_ref += 1
        try:
            self._back_up_hot(on_device)
            device_end = on_device[-1] if on_device else self.root
            loaded = self._load_back(device_end, on_host)
        finally:
            for node in on_host:
                node.host_lock_ref -= 1
        self._count_hits(on_device, on_host, loaded)
        nodes = on_device + loaded
        values = [n.value for n in nodes]
        indices = torch.cat(values) if values else self._no_slots()
        return MatchResult(indices, nodes[-1] if nodes else self.root)

    def _walk(self, key: list[int], count_hits: bool = True) -> list[TreeNode]:
        """Nodes of the longest match in any tier (split so it ends on a node)."""
        node, path = self.root, []
        now = time.monotonic()
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            if count_hits:
                child.last_access_time = now
                child.hit_count += 1
            n = self._match_len(child.key, key)
            if n < len(child.key):
                path.append(self._split_node(child, n))
                break
            path.append(child)
            node, key = child, key[n:]
        return path

    def _count_hits(
        self, on_device: list[TreeNode], on_host: list[TreeNode], loaded: list[TreeNode]
    ) -> None:
        self.stats.device_hit_tokens += sum(len(n.key) for n in on_device)
        if not loaded:  # all or nothing: counted only when the copy happened
            return
        for node in on_host:  # a node prefetched for this request is the storage tier's hit
            if node.id in self._from_storage:
                self._from_storage.discard(node.id)
                self.stats.storage_hit_tokens += len(node.key)
            else:
                self.stats.host_hit_tokens += len(node.key)

    def _load_back(self, anchor: TreeNode, nodes: list[TreeNode]) -> list[TreeNode]:
        """Copy host-only `nodes` (a chain under `anchor`) to fresh device slots; [] when the
        device has no room (they stay host-only and the request recomputes them)."""
        n = sum(len(x.key) for x in nodes)
        if n == 0:
            return []
        self.inc_lock_ref(anchor)  # the device eviction that makes room must spare the match
        try:
            slots = self._alloc_device(n)
        finally:
            self.dec_lock_ref(anchor)
        if slots is None:
            return []
        start, offset = time.perf_counter(), 0
        for node in nodes:
            dev = slots[offset : offset + len(node.key)]
            assert node.host_value is not None
            self.host.load_to_device(node.host_value, dev)
            self._set_device(node, dev)
            offset += len(node.key)
        self.stats.load_back_tokens += n
        self.stats.load_back_bytes += n * self.host.bytes_per_token()
        self.stats.load_back_seconds += time.perf_counter() - start
        return nodes

    def _alloc_device(self, n: int) -> torch.Tensor | None:
        slots = self.allocator.alloc_extend([0], [n], [-1])
        if slots is None:
            self.evict(n - self.allocator.available_size())
            slots = self.allocator.alloc_extend([0], [n], [-1])
        return slots

    def _set_device(self, node: TreeNode, slots: torch.Tensor) -> None:
        """An evicted node gets device slots again (load-back, or a request's own KV)."""
        node.value = slots.to(self.allocator.device)
        node.evicted = False
        self._evictable += len(node.key)
        if self.enable_events:
            self._record_stored(node, MEDIUM_DEVICE)

    # ---- storage --------------------------------------------------------------------------------

    def prefetch(self, rid: str, key: list[int]) -> None:
        """Start reading the pages of `key` past the tree's match from storage (a waiting
        request's; once per request id)."""
        if self.prefetcher is not None and rid not in self._prefetches:
            self._start_prefetch(rid, key, retry=0)

    def _start_prefetch(self, rid: str, key: list[int], retry: int) -> None:
        assert self.prefetcher is not None
        ps = self.page_size
        key = key[: len(key) // ps * ps]
        start, seed = self._reach(key)
        if len(key) - start < max(self.prefetcher.config.threshold, ps):
            return  # the same answer on every rank: the tree and the key are the same
        digests = hash_pages(key[start:], ps, seed)
        self._prefetches[rid] = self.prefetcher.submit(start, digests, retry)

    def prefetch_ready(self, rid: str, key: list[int]) -> bool:
        """Whether the request may be admitted now (always, without a prefetch). When it may,
        the pages its prefetch read go into the tree as a host-only node."""
        op = self._prefetches.get(rid)
        if op is None or self.prefetcher is None:
            return True
        n = self._agree(self.prefetcher.ready_pages(op, time.monotonic()))
        if n == NOT_YET:
            self.stats.prefetch_deferrals += 1
            return False
        del self._prefetches[rid]
        pages = self.prefetcher.finish(op, n)
        if self._attach(key, op.start, op.digests[:n], pages):
            return True
        # The tree lost part of the prefix these pages follow while they were read (evicted
        # for room): read again from where it ends now, once, unless the policy never waits.
        self.stats.prefetch_lost_tokens += len(pages) * self.page_size
        if op.retry or self.prefetcher.config.policy == "best_effort":
            return True
        self._start_prefetch(rid, key, retry=op.retry + 1)
        return rid not in self._prefetches

    def drop_prefetches(self, keep: set[str]) -> None:
        """Stop the prefetches of requests no longer waiting (aborted, or admitted by a path
        that did not ask), releasing their staged pages."""
        for rid in [r for r in self._prefetches if r not in keep]:
            op = self._prefetches.pop(rid)
            if self.prefetcher is not None:
                self.prefetcher.finish(op, 0)

    def prefetches_in_flight(self) -> int:
        return len(self._prefetches)

    def wait_prefetch(self, timeout: float) -> None:
        unfinished = (op for op in self._prefetches.values() if not op.done.is_set())
        op = next(unfinished, None)
        if op is not None:
            op.done.wait(timeout)

    def _reach(self, key: list[int]) -> tuple[int, bytes | None]:
        """How far `key` matches in any tier (no split, no hit), and the chain digest there."""
        node, length, seed = self.root, 0, None
        while key:
            child = node.children.get(self._child_key(key))
            if child is None:
                break
            n = self._match_len(child.key, key)
            pages = n // self.page_size
            seed = child.page_digests[pages - 1] if pages else seed
            length += n
            if n < len(child.key):
                break
            node, key = child, key[n:]
        return length, seed

    def _attach(self, key: list[int], start: int, digests: list[bytes], pages: list[bytes]) -> bool:
        """Pages read for `key[start:]` become a host-only node under the tree's match, from
        where the tree ends now (it may have grown since the read began). False when the tree
        lost part of the prefix before `start` meanwhile: the pages would follow a gap."""
        ps = self.page_size
        end = start + len(pages) * ps
        path = self._walk(key[:end], count_hits=False) if pages else []
        reached = sum(len(n.key) for n in path)
        if not pages or reached >= end:
            return True
        if reached < start:
            return False
        for x in path:  # making host room must not drop the anchor
            x.host_lock_ref += 1
        try:
            slots = self._alloc_host(end - reached)
        finally:
            for x in path:
                x.host_lock_ref -= 1
        if slots is None:
            return True  # no host room: recomputed, as any miss
        skip = (reached - start) // ps
        for i, payload in enumerate(pages[skip:]):
            self.host.write_tokens(slots[i * ps : (i + 1) * ps], payload)
        anchor = path[-1] if path else self.root
        node = TreeNode(next(self._ids), parent=anchor, key=list(key[reached:end]))
        node.value, node.evicted = self._no_slots(), True
        node.host_value, node.page_digests = slots, digests[skip:]
        anchor.children[self._child_key(node.key)] = node
        self._from_storage.add(node.id)
        self.stats.prefetch_tokens += end - reached
        if self.enable_events:
            self._record_stored(node, MEDIUM_HOST)
        return True

    def _queue_storage(self, node: TreeNode, only_missing: bool = False) -> None:
        if self.storage is None or node.host_value is None:
            return
        ps = self.page_size
        queued = False
        for i, digest in enumerate(node.page_digests):
            if only_missing and self.storage.has(digest):
                continue
            payload = self.host.read_tokens(node.host_value[i * ps : (i + 1) * ps])
            self.storage.set_async(digest, payload)
            self.stats.storage_written_pages += 1
            queued = True
        if queued and self.enable_events:  # announced as queued: the write lands shortly
            self._record_stored(node, self.storage.medium)

    def take_events(self) -> list[KVCacheEvent]:
        if self.storage is not None and self.enable_events:
            self.events.extend(
                BlockRemoved([digest_to_int64(d)], medium=self.storage.medium)
                for d in self.storage.take_removed()
            )
        return super().take_events()

    # ---- host copies ----------------------------------------------------------------------------

    def _alloc_host(self, n: int) -> torch.Tensor | None:
        slots = self.host.alloc(n)
        if slots is None:
            self.evict_host(n - self.host.available_size())
            slots = self.host.alloc(n)
        return slots

    def _back_up(self, node: TreeNode) -> bool:
        """Copy a device node to the host pool, with its ancestors that lack a copy (so what
        the host holds is a whole prefix, as its events say), and queue them for storage;
        False without room."""
        path = self._path_to(node)
        chain = [x for x in path if x.host_value is None]
        if not chain:
            return True
        for x in path:  # room is made by dropping other copies: never these
            x.host_lock_ref += 1
        try:
            slots = self._alloc_host(sum(len(x.key) for x in chain))
        finally:
            for x in path:
                x.host_lock_ref -= 1
        if slots is None:
            return False
        offset = 0
        for x in reversed(chain):  # root first: parents' events before their children's
            x.host_value = slots[offset : offset + len(x.key)]
            offset += len(x.key)
            self.host.backup_from_device(x.value, x.host_value)
            self.stats.backup_tokens += len(x.key)
            if self.enable_events:
                self._record_stored(x, MEDIUM_HOST)
            self._queue_storage(x)
        return True

    def _path_to(self, node: TreeNode) -> list[TreeNode]:
        path = []
        while node is not self.root:
            path.append(node)
            assert node.parent is not None
            node = node.parent
        return path

    def _back_up_hot(self, path: list[TreeNode]) -> None:
        if self.config.write_policy != "write_through_selective":
            return
        for node in path:
            if node.host_value is None and node.hit_count >= self.write_threshold:
                self._back_up(node)

    def evict_host(self, num_tokens: int) -> int:
        """Free host slots, least valuable first: copies of nodes still on the device, then
        host-only leaves (each queued for storage first, if it lacks it); returns tokens freed."""
        nodes = list(self._nodes())
        freed = self._release_copies(nodes, num_tokens)
        heap = [self._heap_entry(n) for n in nodes if self._is_host_leaf(n)]
        heapq.heapify(heap)
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            self._queue_storage(leaf, only_missing=True)  # demoted to storage, not lost
            parent = leaf.parent
            assert parent is not None
            del parent.children[self._child_key(leaf.key)]
            self._free_host(leaf)
            freed += len(leaf.key)
            if self._is_host_leaf(parent):
                heapq.heappush(heap, self._heap_entry(parent))
        return freed

    def _release_copies(self, nodes: list[TreeNode], num_tokens: int) -> int:
        """Drop host copies of device-resident nodes (the device still serves them; evicting
        one later copies it again if the host has room): the host then holds what the device
        does not. A node with host-only nodes below it keeps its copy: their prefix. `nodes`:
        the whole tree."""
        anchors: set[int] = set()
        for node in nodes:
            if node.evicted:
                up = node.parent
                while up is not None and up is not self.root and up.id not in anchors:
                    anchors.add(up.id)
                    up = up.parent
        copies = [
            n
            for n in nodes
            if n is not self.root
            and not n.evicted
            and n.host_value is not None
            and n.host_lock_ref == 0
            and n.id not in anchors
        ]
        freed = 0
        for node in sorted(copies, key=lambda n: self._heap_entry(n)[:2]):
            if freed >= num_tokens:
                break
            self._queue_storage(node, only_missing=True)
            self._free_host(node)
            freed += len(node.key)
        return freed

    def _heap_entry(self, node: TreeNode) -> tuple[tuple[float, ...], int, TreeNode]:
        return (eviction_key(self.eviction_policy, node), node.id, node)

    def _is_host_leaf(self, node: TreeNode) -> bool:
        return (
            node is not self.root and node.evicted and not node.children and node.host_lock_ref == 0
        )

    def _free_host(self, node: TreeNode) -> None:
        if node.host_value is None:
            return
        self.host.free(node.host_value)
        node.host_value = None
        self._from_storage.discard(node.id)
        if self.enable_events:
            self.events.extend(
                BlockRemoved([digest_to_int64(d)], medium=MEDIUM_HOST) for d in node.page_digests
            )

    # ---- device eviction: demote, or drop -------------------------------------------------------

    def evict(self, num_tokens: int) -> int:
        heap = [self._heap_entry(n) for n in self._device_leaves()]
        heapq.heapify(heap)
        freed = 0
        while freed < num_tokens and heap:
            _, _, leaf = heapq.heappop(heap)
            parent = leaf.parent
            assert parent is not None
            # demote (copied, with any ancestor that lacks a copy) rather than drop
            keep = leaf.host_value is not None or self._worth_keeping(leaf)
            if keep and self._back_up(leaf):
                self._free_device(leaf)  # demoted: the node stays, host-only
            else:
                self._drop(leaf)
            freed += len(leaf.key)
            if self._is_device_leaf(parent):
                heapq.heappush(heap, self._heap_entry(parent))
        return freed

    def _worth_keeping(self, node: TreeNode) -> bool:
        """Whether an evicted node without a host copy is copied down: always, but under
        write_through_selective only once it was hit often enough."""
        if self.config.write_policy == "write_through_selective":
            return node.hit_count >= self.write_threshold
        return True

    def _is_device_leaf(self, node: TreeNode) -> bool:
        return (
            node is not self.root
            and not node.evicted
            and node.lock_ref == 0
            and all(c.evicted for c in node.children.values())
        )

    def _device_leaves(self) -> list[TreeNode]:
        out, stack = [], [self.root]
        while stack:
            node = stack.pop()
            if self._is_device_leaf(node):
                out.append(node)
            stack.extend(c for c in node.children.values() if not c.evicted)
        return out

    def _free_device(self, node: TreeNode) -> None:
        self.allocator.free(node.value)
        self._evictable -= len(node.key)
        node.value, node.evicted = self._no_slots(), True
        if self.enable_events:
            self.events.extend(
                BlockRemoved([digest_to_int64(d)], medium=MEDIUM_DEVICE) for d in node.page_digests
            )

    def _drop(self, node: TreeNode) -> None:
        """Remove a device leaf that could not be demoted, and the host-only nodes below it."""
        parent = node.parent
        assert parent is not None
        del parent.children[self._child_key(node.key)]
        self._free_device(node)
        # the node too: it may hold a copy whose ancestors could not get one (then it is dropped)
        for below in self._nodes(node):
            self._free_host(below)
            self.stats.dropped_tokens += len(below.key)

    # ---- insert and split know about evicted nodes ----------------------------------------------

    def _holds(self, node: TreeNode, slots: torch.Tensor) -> bool:
        """An evicted node met by insert takes the caller's slots for its tokens (they hold the
        same KV), so only the device-resident prefix counts as cached."""
        if not node.evicted:
            return True
        self._set_device(node, slots.clone())
        return False

    def _add_leaf(self, parent: TreeNode, key: list[int], value: torch.Tensor) -> TreeNode:
        leaf = super()._add_leaf(parent, key, value)
        if self.config.write_policy == "write_through":
            self._back_up(leaf)
        return leaf

    def _split_node(self, child: TreeNode, n: int) -> TreeNode:
        upper = super()._split_node(child, n)
        upper.evicted = child.evicted
        upper.host_lock_ref = child.host_lock_ref
        if child.id in self._from_storage:
            self._from_storage.add(upper.id)
        if child.host_value is not None:
            upper.host_value = child.host_value[:n]
            child.host_value = child.host_value[n:]
        return upper

    # ---- inspection -----------------------------------------------------------------------------

    def cached_page_hashes(self) -> list[int]:
        """Event hashes of the pages in the KV pool (what a router's device mirror holds; the
        host tier's pages are its host mirror's)."""
        pages = (n.page_digests for n in self._nodes() if not n.evicted)
        return sorted(digest_to_int64(d) for digests in pages for d in digests)

    def host_tokens(self) -> int:
        """Tokens held by the host pool (duplicates of device nodes included)."""
        return self.host.size - self.host.available_size()

    def tier_sizes(self) -> dict[str, int]:
        """Tokens per residency: device only, both, host only."""
        sizes = {"device": 0, "both": 0, "host": 0}
        for node in self._nodes():
            if node is self.root:
                continue
            if node.evicted:
                sizes["host"] += len(node.key)
            elif node.host_value is not None:
                sizes["both"] += len(node.key)
            else:
                sizes["device"] += len(node.key)
        return sizes
