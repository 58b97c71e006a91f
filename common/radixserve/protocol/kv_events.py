"""KV-cache events: the engine ⇄ router contract, wire-compatible with SGLang and vLLM.

Encoding (what our engine publishes): SGLang 0.5.23's — a batch is a positional msgpack array
`[ts, [event, ...], attn_dp_rank]`; each event a tagged msgpack map
`{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids", "block_size",
"lora_id", "medium", "lora_name"}`, `{"type": "BlockRemoved", "block_hashes", "medium"}` or
`{"type": "AllBlocksCleared"}`. Every field is written (None as nil), because vLLM's and
SGLang's decoders require some optional-valued fields to be present. `event_format="array"`
writes SGLang ≤ 0.5.6's shape instead: each event a positional array with its tag first,
`["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id?]`.

Decoding accepts all of them: array or map events (mixed too), the batch as an array or a map
(`ts`, `events`, `attn_dp_rank` or vLLM's `data_parallel_rank`), unknown optional fields
ignored (cache_salt, session_id, extra_keys, group_idx, …), and block hashes as ints or bytes
(vLLM): bytes become their first 8 bytes read as a big-endian signed int64, the same rule
SGLang applies to its SHA-256 hex digests, so a hash and its parent link map alike.
On ZMQ PUB each batch travels as frames `[topic, seq as 8-byte big-endian, payload]`.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any, Literal

import msgspec

EventFormat = Literal["map", "array"]
EVENT_FORMATS: tuple[EventFormat, ...] = ("map", "array")


class BlockStored(msgspec.Struct, tag=True, frozen=True):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None
    lora_name: str | None = None


class BlockRemoved(msgspec.Struct, tag=True, frozen=True):
    block_hashes: list[int]
    medium: str | None = None


class AllBlocksCleared(msgspec.Struct, tag=True, frozen=True):
    pass


KVCacheEvent = BlockStored | BlockRemoved | AllBlocksCleared


class KVEventBatch(msgspec.Struct, array_like=True, frozen=True):
    ts: float
    events: list[KVCacheEvent]
    attn_dp_rank: int | None = None


# ---- SGLang ≤ 0.5.6: positional events ----------------------------------------------------------


class _ArrayStored(
    msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockStored", frozen=True
):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None


class _ArrayRemoved(
    msgspec.Struct, array_like=True, omit_defaults=True, tag="BlockRemoved", frozen=True
):
    block_hashes: list[int]


class _ArrayCleared(
    msgspec.Struct, array_like=True, omit_defaults=True, tag="AllBlocksCleared", frozen=True
):
    pass


_ArrayEvent = _ArrayStored | _ArrayRemoved | _ArrayCleared


class _ArrayBatch(msgspec.Struct, array_like=True, omit_defaults=True, frozen=True):
    ts: float
    events: list[_ArrayEvent]
    attn_dp_rank: int | None = None


_ENCODER = msgspec.msgpack.Encoder()
_DECODER = msgspec.msgpack.Decoder(KVEventBatch)  # the fast path: our own map format
_ANY_DECODER = msgspec.msgpack.Decoder()


def _to_array(event: KVCacheEvent) -> _ArrayEvent:
    if isinstance(event, BlockStored):
        return _ArrayStored(
            event.block_hashes,
            event.parent_block_hash,
            event.token_ids,
            event.block_size,
            event.lora_id,
        )
    if isinstance(event, BlockRemoved):
        return _ArrayRemoved(event.block_hashes)
    return _ArrayCleared()


def parse_event_format(value: str, field: str = "event_format") -> EventFormat:
    """A config string → EventFormat; ValueError naming `field` for anything else."""
    if value == "map":
        return "map"
    if value == "array":
        return "array"
    raise ValueError(f"{field}: expected one of {', '.join(EVENT_FORMATS)}, got {value!r}")


def encode_batch(batch: KVEventBatch, event_format: EventFormat = "map") -> bytes:
    """msgpack bytes of `batch`: tagged-map events (SGLang 0.5.23 / vLLM) or positional."""
    if event_format == "map":
        return _ENCODER.encode(batch)
    if event_format == "array":
        events = [_to_array(e) for e in batch.events]
        return _ENCODER.encode(_ArrayBatch(batch.ts, events, batch.attn_dp_rank))
    raise ValueError(f"event_format: expected one of {EVENT_FORMATS}, got {event_format!r}")


def decode_batch(payload: bytes) -> KVEventBatch:
    """Any supported shape → KVEventBatch; raises msgspec.DecodeError / ValidationError."""
    try:
        return _DECODER.decode(payload)
    except msgspec.ValidationError:
        pass  # another engine's shape: take it apart generically
    raw = _ANY_DECODER.decode(payload)
    if isinstance(raw, dict):
        rank = raw.get("attn_dp_rank", raw.get("data_parallel_rank"))
        raw = [raw.get("ts"), raw.get("events"), rank]
    if not isinstance(raw, list) or not 2 <= len(raw) <= 3 or not isinstance(raw[1], list):
        raise msgspec.ValidationError("batch: expected [ts, events, dp_rank?] or a map")
    events = [_event(e) for e in raw[1]]
    return msgspec.convert([raw[0], events, *raw[2:]], KVEventBatch)


def _hash(value: Any) -> Any:
    """vLLM's bytes hashes → int64 (first 8 bytes, big-endian, signed); others unchanged."""
    if isinstance(value, bytes | bytearray):
        return int.from_bytes(bytes(value[:8]).rjust(8, b"\0"), "big", signed=True)
    return value


_FIELDS = MappingProxyType({
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id",
                    "medium", "lora_name"),
    "BlockRemoved": ("block_hashes", "medium"),
    "AllBlocksCleared": (),
})  # fmt: skip


def _event(raw: Any) -> dict[str, Any]:
    """One event, array or map, as the map our structs decode (known fields, int hashes)."""
    if isinstance(raw, list):
        if not raw or not isinstance(raw[0], str) or raw[0] not in _FIELDS:
            raise msgspec.ValidationError(f"event: unknown array event {raw[:1]!r}")
        fields = dict(zip(_FIELDS[raw[0]], raw[1:], strict=False))
        fields["type"] = raw[0]
    elif isinstance(raw, dict) and isinstance(raw.get("type"), str) and raw["type"] in _FIELDS:
        fields = {k: raw[k] for k in ("type", *_FIELDS[raw["type"]]) if k in raw}
    else:
        raise msgspec.ValidationError(f"event: expected a tagged array or map, got {raw!r:.80}")
    if isinstance(fields.get("block_hashes"), list):
        fields["block_hashes"] = [_hash(h) for h in fields["block_hashes"]]
    if "parent_block_hash" in fields:
        fields["parent_block_hash"] = _hash(fields["parent_block_hash"])
    return fields


def seq_to_bytes(seq: int) -> bytes:
    return seq.to_bytes(8, "big", signed=True)


def seq_from_bytes(frame: bytes) -> int:
    return int.from_bytes(frame, "big", signed=True)
