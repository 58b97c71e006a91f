"""The router's cache mirrors: one radix tree per target, exact from KV events or approximate."""

from __future__ import annotations

from radixserve.router.mirror.approx import ApproxTree
from radixserve.router.mirror.index import CacheIndex, TargetCacheStats
from radixserve.router.mirror.subscriber import KVEventSubscriber
from radixserve.router.mirror.tree import MirrorTree, encode_tokens

__all__ = [
    "ApproxTree",
    "CacheIndex",
    "KVEventSubscriber",
    "MirrorTree",
    "TargetCacheStats",
    "encode_tokens",
]
