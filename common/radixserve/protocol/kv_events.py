"""KV-cache events: the engine ⇄ router contract, wire-compatible with SGLang's.

msgpack, array-like tagged structs: a batch is `[ts, [event, ...], attn_dp_rank]`, each event
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id?]`,
`["BlockRemoved", block_hashes]` or `["AllBlocksCleared"]`. On ZMQ PUB each batch travels as
frames `[topic, seq as 8-byte big-endian, payload]`.
"""

from __future__ import annotations

import msgspec


class BlockStored(msgspec.Struct, array_like=True, omit_defaults=True, tag=True, frozen=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


class BlockRemoved(msgspec.Struct, array_like=True, omit_defaults=True, tag=True, frozen=True):
    block_hashes: list[int]


class AllBlocksCleared(msgspec.Struct, array_like=True, omit_defaults=True, tag=True, frozen=True):
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    ts: float
    events: list[KVCacheEvent]
    attn_dp_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(batch: KVEventBatch) -> bytes:
    return _ENCODER.encode(batch)


def decode_batch(payload: bytes) -> KVEventBatch:
    return _DECODER.decode(payload)


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)
