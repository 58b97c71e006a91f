"""Wire contracts shared by engine and router (KV events, block hashing); imports no torch."""

from __future__ import annotations

from radixserve.protocol.block_hash import block_hashes, digest_to_int64, hash_page, hash_pages
from radixserve.protocol.kv_events import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVCacheEvent,
    KVEventBatch,
    decode_batch,
    encode_batch,
)

__all__ = [
    "AllBlocksCleared",
    "BlockRemoved",
    "BlockStored",
    "KVCacheEvent",
    "KVEventBatch",
    "block_hashes",
    "decode_batch",
    "digest_to_int64",
    "encode_batch",
    "hash_page",
    "hash_pages",
]
