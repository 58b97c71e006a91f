"""BasePrefixCache: what the scheduler asks of a prefix cache (radix tree or none).

Ownership: KV slots in `prefix_indices` up to `req.cache_protected_len` belong to the cache
(and are pinned by the request's lock on `req.last_node`); slots beyond belong to the request
until `cache_unfinished_req` / `cache_finished_req` hands them over or frees them.

The caches see a request (the scheduler's `Req`) only through `CachedReq`: the fields of that
hand-over, and nothing of the scheduler.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, NamedTuple, Protocol

import torch


class CachedReq(Protocol):
    """What a prefix cache reads and writes on a request when its KV changes hands."""

    # written by the hand-over
    req_pool_idx: int | None  # its ReqToTokenPool row; None once freed
    prefix_indices: torch.Tensor  # [n] int64 KV slots of the computed / cached prefix
    last_node: Any  # the tree node its lock pins (None: no lock)
    cache_protected_len: int  # leading slots of its row owned by the cache

    @property
    def fill_ids(self) -> list[int]:
        """The tokens its last extend computed (prompt + outputs, possibly cut to a chunk)."""
        ...

    @property
    def kv_allocated_len(self) -> int:
        """Positions with a KV slot in its row."""
        ...

    def full_ids(self) -> list[int]:
        """Prompt + outputs so far."""
        ...


class MatchResult(NamedTuple):
    indices: torch.Tensor  # [n] int64 KV slots of the matched prefix, on the pool's device
    last_node: Any  # node to lock while the request uses the prefix


class PrefixPeek(NamedTuple):
    """A read-only match: how much of a key is cached and where in the tree the match ends."""

    length: int  # matched tokens (page-aligned)
    node: Any  # deepest node sharing the match (which may end inside it); None without a tree


class BasePrefixCache(ABC):
    @abstractmethod
    def match_prefix(self, key: list[int]) -> MatchResult:
        """Longest cached prefix of `key` (page-aligned), for a request being admitted: may
        split a node so the match ends on a node boundary, and counts a hit on its path."""

    @abstractmethod
    def peek_prefix(self, key: list[int]) -> PrefixPeek:
        """Length of the longest cached prefix of `key`, changing nothing (no split, no hit
        count, no access time): for ordering and budgeting requests that may keep waiting."""

    def evictable_in_match(self, peek: PrefixPeek) -> int:
        """Tokens that locking `peek`'s match would move from evictable to protected. Valid
        while no insert or eviction ran since the peek (splits are allowed)."""
        return 0

    def lock_span(self, peek: PrefixPeek) -> PrefixPeek:
        """What `inc_lock_ref(peek.node)` would protect (whole nodes, from the root)."""
        return peek

    @abstractmethod
    def cache_unfinished_req(self, req: CachedReq) -> None:
        """After a prefill or chunk: make req.fill_ids' KV reusable, update req.prefix_indices."""

    @abstractmethod
    def cache_finished_req(self, req: CachedReq, is_insert: bool = True) -> None:
        """At finish (or retraction when is_insert=False): hand over or free all of req's KV
        and its ReqToTokenPool row, and drop its lock."""

    @abstractmethod
    def evict(self, num_tokens: int) -> int:
        """Free at least num_tokens unlocked cached tokens if possible; returns tokens freed."""

    def inc_lock_ref(self, node: Any) -> None:  # noqa: B027 - no-op when nothing is shared
        """Pin node and its ancestors."""

    def dec_lock_ref(self, node: Any) -> None:  # noqa: B027
        """Unpin node and its ancestors."""

    def evictable_size(self) -> int:
        return 0

    def protected_size(self) -> int:
        return 0

    # ---- storage prefetch (HiCache with a storage tier; nothing to do elsewhere) ----------------

    prefetches = False  # whether prefetch does anything: the scheduler skips the calls if not

    def prefetch(self, rid: str, key: list[int]) -> None:  # noqa: B027
        """A waiting request's prefix may be read from storage ahead of its admission."""

    def prefetch_ready(self, rid: str, key: list[int]) -> bool:
        """Whether the request may be admitted now (its prefetch policy allows it)."""
        return True

    def wait_prefetch(self, timeout: float) -> None:  # noqa: B027
        """Block up to `timeout` seconds for a prefetch to finish (an idle engine's wait)."""

    def drop_prefetches(self, keep: set[str]) -> None:  # noqa: B027
        """Stop the prefetches of requests other than `keep` (no longer waiting)."""

    def close(self) -> None:  # noqa: B027 - only caches with threads or files have work here
        """Stop background work (HiCache's storage writer); the cache is not used after."""

    @abstractmethod
    def reset(self) -> None:
        """Drop everything cached (the caller clears the pools)."""
