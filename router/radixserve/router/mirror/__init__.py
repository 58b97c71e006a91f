"""The router's cache mirrors: one radix tree per rank, exact from KV events or approximate."""

from __future__ import annotations

from radixserve.router.mirror.approx import ApproxTree
from radixserve.router.mirror.index import CacheIndex, RankCacheStats
from radixserve.router.mirror.subscriber import KVEventSubscriber
from radixserve.router.mirror.tree import MirrorTree, encode_tokens

__all__ = [
    "ApproxTree",
    "CacheIndex",
    "KVEventSubscriber",
    "MirrorTree",
    "RankCacheStats",
    "encode_tokens",
]
