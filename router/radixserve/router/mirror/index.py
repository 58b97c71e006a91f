"""CacheIndex: the router's view of what every rank caches, one tree per rank.

A rank with a KV-event endpoint gets a MirrorTree kept exact by a KVEventSubscriber ("events"
mode); one without gets an ApproxTree of the prompts routed to it ("approx" mode, sgl-router's
fallback). An events rank also has an InflightOverlay of the prompts routed to it and not
yet confirmed by its events, and a fallback ApproxTree of the prompts routed there, matched
instead of the mirror while its event stream is lost (the mirror is frozen then). `match`
encodes the prompt once and walks each rank's tree: the cached prefix in tokens,
page-aligned like the engine's own match; `match_both` adds the overlay's "arriving" prefix
beside it. Everything runs on the event loop, no thread: the trees are only touched between
awaits.

Tiers (HiCache): events whose `medium` names a host tier (SGLang's `CPU_PINNED`, vLLM's
`CPU`) go to a second mirror of the rank, made on the first such event, so tier-blind engines
cost nothing extra. `match_both` then reports, beside the device prefix, the prefix the host
mirror holds: the engine loads that part back instead of recomputing it. Storage media
(`DISK`, `EXTERNAL`) go to a storage mirror shared by every rank that reports the same storage
id (`/server_info` `dp_ranks[].hicache_storage_id`): a page one replica stored counts for all
that read the same storage.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import NamedTuple

import zmq.asyncio

from radixserve.protocol.kv_events import AllBlocksCleared, KVCacheEvent, KVEventBatch
from radixserve.router.addresses import KVEndpoint, RankKey, reachable_endpoint
from radixserve.router.mirror.approx import ApproxTree
from radixserve.router.mirror.inflight import InflightOverlay, OverlayLimits
from radixserve.router.mirror.subscriber import REPLAY_TIMEOUT_S, KVEventSubscriber
from radixserve.router.mirror.tree import DEFAULT_MAX_ORPHANS, MirrorTree, encode_tokens

logger = logging.getLogger(__name__)

DEFAULT_APPROX_MAX_TOKENS = 1 << 22
FALLBACK_MAX_TOKENS = 1 << 20  # an events rank's routed prompts, for when its stream is lost
RECENT_POOLS = 2  # the recent working set is kept up to this many times the rank's KV pool
HOST_MEDIA = frozenset({"CPU_PINNED", "CPU"})  # SGLang's and vLLM's host-tier names
STORAGE_MEDIA = frozenset({"DISK", "EXTERNAL"})


@dataclass(frozen=True)
class RankCacheStats:
    """One rank's cache view, for /metrics. Approx mode has no stream (last_seq -1, no
    resets or replays) and counts num_blocks as num_tokens // page_size."""

    mode: str  # "events" | "approx"
    num_tokens: int
    num_blocks: int
    last_seq: int = -1
    resets: int = 0
    replays: int = 0


class PrefixMatch(NamedTuple):
    """One rank's prefix for one prompt, in tokens: `cached` is what the rank holds now
    (the only number reported as cached); `inflight` what prompts routed there and not yet
    confirmed by its events share with it (0 for approx ranks, whose tree already has them)."""

    cached: int
    inflight: int = 0
    host: int = 0  # the prefix the rank's host tier holds (0: none, or a tier-blind engine)
    storage: int = 0  # the prefix the rank's storage tier holds (shared with its storage group)


class LazyMirror:
    """A tier's mirror (a rank's host tier, or a storage shared by ranks), made on its first
    event: tier-blind engines never pay for it."""

    def __init__(self, page_size: int, max_orphans: int) -> None:
        self.page_size = page_size
        self.max_orphans = max_orphans
        self.tree: MirrorTree | None = None

    def apply(self, event: KVCacheEvent) -> None:
        if self.tree is None:
            self.tree = MirrorTree(self.page_size, self.max_orphans)
        self.tree.apply(event)

    def clear(self) -> None:
        if self.tree is not None:
            self.tree.clear()

    def match_encoded(self, q: bytes) -> int:
        return 0 if self.tree is None else self.tree.match_encoded(q)


@dataclass(frozen=True)
class _RankCache:
    """What the index holds for one rank: its tree and, for an events rank, its stream."""

    page_size: int
    kv: KVEndpoint | None
    tree: MirrorTree | ApproxTree
    subscriber: KVEventSubscriber | None
    overlay: InflightOverlay | None = None
    # events ranks: the prompts routed there, matched while the event stream is lost
    fallback: ApproxTree | None = None
    # the prompts routed there most recently, up to RECENT_POOLS × its KV pool (pool known)
    recent: ApproxTree | None = None
    host: LazyMirror | None = None  # events ranks: its host tier (HiCache)
    storage: LazyMirror | None = None  # its storage group's mirror (shared), None: no storage

    def matching_tree(self) -> MirrorTree | ApproxTree:
        """The exact mirror, or the approximate view while the rank's stream is lost."""
        lost = self.subscriber is not None and self.subscriber.stream_lost
        return self.fallback if lost and self.fallback is not None else self.tree


def _dialable(kv: KVEndpoint, worker_url: str) -> KVEndpoint:
    """An engine bound to 0.0.0.0 advertises that; dial the worker's host instead (tcp only)."""

    def fix(ep: str | None) -> str | None:
        return reachable_endpoint(ep, worker_url) if ep and ep.startswith("tcp://") else ep

    endpoint = fix(kv.endpoint) or kv.endpoint
    return KVEndpoint(kv.dp_rank, endpoint, fix(kv.replay_endpoint), kv.topic)


class CacheIndex:
    def __init__(
        self,
        approx_max_tokens: int = DEFAULT_APPROX_MAX_TOKENS,
        ctx: zmq.asyncio.Context | None = None,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        max_orphans: int = DEFAULT_MAX_ORPHANS,
        overlay_limits: OverlayLimits | None = None,
    ) -> None:
        ApproxTree(approx_max_tokens)  # fail fast: ValueError naming max_tokens
        self.approx_max_tokens = approx_max_tokens
        self.overlay_limits = overlay_limits or OverlayLimits()
        self.replay_timeout_s = replay_timeout_s
        self.max_orphans = max_orphans
        self._own_ctx = ctx is None
        self._ctx = ctx if ctx is not None else zmq.asyncio.Context()
        self._ranks: dict[RankKey, _RankCache] = {}
        self._storage: dict[str, LazyMirror] = {}  # storage id → the mirror its ranks share
        self._started = False

    # ---- lifecycle ----------------------------------------------------------------------------

    async def start(self) -> None:
        """Start the subscribers of the ranks added so far; later ones start when added."""
        self._started = True
        for cache in self._ranks.values():
            if cache.subscriber is not None:
                cache.subscriber.start()

    async def aclose(self) -> None:
        for key in list(self._ranks):
            await self.remove_rank(key)
        self._started = False
        if self._own_ctx:
            self._ctx.destroy(linger=0)

    # ---- ranks --------------------------------------------------------------------------------

    def add_rank(  # noqa: PLR0913 - what a worker's probe says of one rank
        self,
        key: RankKey,
        page_size: int,
        kv: KVEndpoint | None = None,
        pool_tokens: int = 0,
        storage_id: str | None = None,
    ) -> None:
        """Follow a rank: by its KV events when `kv` is given, else approximately. Adding the
        same rank again with the same settings does nothing; with others is an error.
        `pool_tokens` (its KV pool, 0: unknown) sizes the recent working set it keeps;
        `storage_id` names its HiCache storage (ranks with one id share a storage mirror)."""
        if not isinstance(page_size, int) or page_size < 1:
            raise ValueError(f"page_size: must be an integer ≥ 1, got {page_size!r}")
        if not isinstance(pool_tokens, int) or pool_tokens < 0:
            raise ValueError(f"pool_tokens: must be an integer ≥ 0, got {pool_tokens!r}")
        recent = ApproxTree(RECENT_POOLS * pool_tokens) if pool_tokens else None
        if kv is not None:
            kv = _dialable(kv, key[0])
        known = self._ranks.get(key)
        if known is not None:
            if (known.page_size, known.kv) != (page_size, kv):
                raise ValueError(f"key: rank {key} is already followed; remove it first")
            return
        if kv is None:
            approx = ApproxTree(self.approx_max_tokens)
            self._ranks[key] = _RankCache(page_size, None, approx, None, recent=recent)
            return
        tree = MirrorTree(page_size, self.max_orphans)
        host = LazyMirror(page_size, self.max_orphans)
        storage = None
        if storage_id is not None:
            storage = self._storage.setdefault(
                f"{storage_id}#{page_size}", LazyMirror(page_size, self.max_orphans)
            )
        overlay = InflightOverlay(page_size, self.overlay_limits)
        name = f"{key[0]}#{key[1]}"

        def reset() -> None:
            tree.clear()
            host.clear()

        subscriber = KVEventSubscriber(
            kv,
            on_batch=lambda batch: self._apply(name, tree, host, storage, overlay, batch),
            on_reset=reset,
            ctx=self._ctx,
            replay_timeout_s=self.replay_timeout_s,
            name=name,
        )
        fallback = ApproxTree(min(self.approx_max_tokens, FALLBACK_MAX_TOKENS))
        self._ranks[key] = _RankCache(
            page_size, kv, tree, subscriber, overlay, fallback, recent, host, storage
        )
        if self._started:
            subscriber.start()

    async def remove_rank(self, key: RankKey) -> None:
        """Stop following a rank (its subscriber ends, its tree is dropped); unknown: no-op."""
        cache = self._ranks.pop(key, None)
        if cache is not None and cache.subscriber is not None:
            await cache.subscriber.aclose()

    async def wait_synced(self, keys: Iterable[RankKey], timeout_s: float) -> bool:
        """Wait until every events rank among `keys` has applied its publisher's replay buffer
        (or its subscriber gave up); False when `timeout_s` passed first."""
        waits = [
            t.subscriber.synced.wait()
            for key in keys
            if (t := self._ranks.get(key)) is not None and t.subscriber is not None
        ]
        if not waits or not self._started:
            return True
        try:
            await asyncio.wait_for(asyncio.gather(*waits), timeout_s)
        except asyncio.TimeoutError:
            return False
        return True

    def keys(self) -> list[RankKey]:
        return list(self._ranks)

    def __contains__(self, key: object) -> bool:
        return key in self._ranks

    # ---- the router's calls -------------------------------------------------------------------

    def match(self, tokens: Sequence[int], keys: Iterable[RankKey]) -> dict[RankKey, int]:
        """Cached prefix length in tokens per rank (0 for a rank not followed)."""
        q = encode_tokens(tokens)
        out: dict[RankKey, int] = {}
        for key in keys:
            cache = self._ranks.get(key)
            if cache is None:
                out[key] = 0
            elif cache.matching_tree() is cache.tree and cache.subscriber is not None:
                out[key] = cache.tree.match_encoded(q)
            else:  # the engine matches whole pages only
                n = cache.matching_tree().match_encoded(q)
                out[key] = n - n % cache.page_size
        return out

    def match_both(
        self, tokens: Sequence[int], keys: Iterable[RankKey]
    ) -> dict[RankKey, PrefixMatch]:
        """`match` plus each events rank's in-flight prefix (see PrefixMatch)."""
        return self.match_both_encoded(encode_tokens(tokens), keys)

    def match_both_encoded(self, q: bytes, keys: Iterable[RankKey]) -> dict[RankKey, PrefixMatch]:
        """`match_both` of a prompt already encoded (`encode_tokens`)."""
        out: dict[RankKey, PrefixMatch] = {}
        for key in keys:
            cache = self._ranks.get(key)
            if cache is None:
                out[key] = PrefixMatch(0)
            elif cache.overlay is not None and cache.matching_tree() is cache.tree:
                host = cache.host.match_encoded(q) if cache.host is not None else 0
                stored = cache.storage.match_encoded(q) if cache.storage is not None else 0
                out[key] = PrefixMatch(
                    cache.tree.match_encoded(q), cache.overlay.match_encoded(q), host, stored
                )
            else:  # approx: its tree already holds the prompts routed there
                n = cache.matching_tree().match_encoded(q)
                out[key] = PrefixMatch(n - n % cache.page_size)
        return out

    def on_routed(self, key: RankKey, tokens: Sequence[int]) -> int | None:
        """A prompt was sent to `key`: approx ranks remember it; an events rank counts its
        pages as arriving until its events store them. Returns the overlay entry to pass to
        `on_finished` when the request ends or fails (None: nothing to undo)."""
        return self.on_routed_encoded(key, encode_tokens(tokens))

    def on_routed_encoded(self, key: RankKey, q: bytes) -> int | None:
        """`on_routed` of a prompt already encoded (`encode_tokens`)."""
        cache = self._ranks.get(key)
        if cache is None:
            return None
        if cache.recent is not None:
            cache.recent.insert_encoded(q)
        if isinstance(cache.tree, ApproxTree):
            cache.tree.insert_encoded(q)
            return None
        if cache.fallback is not None:
            cache.fallback.insert_encoded(q)
        assert cache.overlay is not None
        return cache.overlay.add(q)

    def on_finished(self, key: RankKey, entry: int | None) -> None:
        """The request of `on_routed`'s entry ended or failed: its pages stop arriving."""
        cache = self._ranks.get(key)
        if entry is not None and cache is not None and cache.overlay is not None:
            cache.overlay.discard(entry)

    def size_of(self, key: RankKey) -> int:
        """Tokens the rank's tree holds (0 for a rank not followed)."""
        cache = self._ranks.get(key)
        return cache.tree.num_tokens if cache is not None else 0

    def working_set_of(self, key: RankKey) -> int:
        """Distinct tokens of the prompts routed to the rank lately (the newest up to
        RECENT_POOLS × its KV pool): what it is asked to hold, in flight or not, cached or
        already evicted; 0 when its pool size is unknown."""
        cache = self._ranks.get(key)
        return cache.recent.num_tokens if cache is not None and cache.recent else 0

    def overlay_of(self, key: RankKey) -> InflightOverlay | None:
        """The rank's in-flight overlay (None: approx or unknown rank); for tests/metrics."""
        cache = self._ranks.get(key)
        return cache.overlay if cache is not None else None

    def stats(self) -> dict[RankKey, RankCacheStats]:
        out: dict[RankKey, RankCacheStats] = {}
        for key, t in self._ranks.items():
            sub = t.subscriber
            if sub is None or sub.stream_lost:
                n = t.matching_tree().num_tokens
                out[key] = RankCacheStats("approx", n, n // t.page_size)
            else:
                assert isinstance(t.tree, MirrorTree)
                out[key] = RankCacheStats(
                    "events",
                    t.tree.num_tokens,
                    t.tree.num_blocks,
                    sub.last_seq,
                    sub.resets,
                    sub.replays,
                )
        return out

    @staticmethod
    def _apply(
        name: str,
        tree: MirrorTree,
        host: LazyMirror,
        storage: LazyMirror | None,
        overlay: InflightOverlay,
        batch: KVEventBatch,
    ) -> None:
        for event in batch.events:
            medium = getattr(event, "medium", None)
            try:
                if medium in HOST_MEDIA:
                    host.apply(event)
                elif medium in STORAGE_MEDIA:
                    if storage is not None:  # a storage nobody else can read is not scored
                        storage.apply(event)
                else:
                    tree.apply(event)
                    if isinstance(event, AllBlocksCleared):
                        host.clear()
            except ValueError as exc:  # one bad event must not cost the rest of the batch
                logger.warning("KV events %s: event skipped: %s", name, exc)
        if overlay.num_entries:
            overlay.confirm(tree.match_encoded)  # stored pages now count as cached, not arriving
