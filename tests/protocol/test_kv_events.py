"""KV-event wire format: typed round trip, the raw msgpack layouts (tagged maps by default,
SGLang 0.5.6 arrays on request), lenient decoding, and the 8-byte sequence-number frames."""

from __future__ import annotations

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from radixserve.protocol import (
    AllBlocksCleared,
    BlockRemoved,
    BlockStored,
    KVEventBatch,
    decode_batch,
    encode_batch,
)
from radixserve.protocol.kv_events import parse_event_format, seq_from_bytes, seq_to_bytes

H1, H2, H3 = 6738917275443968386, -2360060374177730597, 5080553031686747138


def _batch(rank: int | None = 3) -> KVEventBatch:
    return KVEventBatch(
        ts=1712345678.25,
        events=[
            BlockStored([H1], H2, [10, 11, 12, 13], 4),
            BlockRemoved([H3]),
            AllBlocksCleared(),
        ],
        attn_dp_rank=rank,
    )


# ---- typed round trip ------------------------------------------------------------------------


def test_round_trip_keeps_all_three_event_types() -> None:
    batch = _batch()
    decoded = decode_batch(encode_batch(batch))
    assert decoded == batch
    assert [type(e) for e in decoded.events] == [BlockStored, BlockRemoved, AllBlocksCleared]


def test_round_trip_keeps_lora_id_and_none_parent() -> None:
    batch = KVEventBatch(1.0, [BlockStored([H1], None, [7], 1, lora_id=5)], 0)
    assert decode_batch(encode_batch(batch)) == batch


def test_round_trip_without_rank_decodes_rank_none() -> None:
    assert decode_batch(encode_batch(_batch(rank=None))).attn_dp_rank is None


# ---- raw layout (SGLang wire compatibility) --------------------------------------------------


def test_raw_layout_is_an_array_batch_of_tagged_maps() -> None:
    raw = msgspec.msgpack.decode(encode_batch(_batch()))
    stored = {"lora_id": None, "medium": None, "lora_name": None}
    assert raw == [
        1712345678.25,
        [
            {"type": "BlockStored", "block_hashes": [H1], "parent_block_hash": H2,
             "token_ids": [10, 11, 12, 13], "block_size": 4, **stored},
            {"type": "BlockRemoved", "block_hashes": [H3], "medium": None},
            {"type": "AllBlocksCleared"},
        ],
        3,
    ]  # fmt: skip


def test_array_format_is_sglang_056s_tagged_arrays() -> None:
    raw = msgspec.msgpack.decode(encode_batch(_batch(), "array"))
    assert raw == [
        1712345678.25,
        [
            ["BlockStored", [H1], H2, [10, 11, 12, 13], 4, None],
            ["BlockRemoved", [H3]],
            ["AllBlocksCleared"],
        ],
        3,
    ]
    batch = KVEventBatch(2.0, [BlockStored([H1], None, [7], 1, lora_id=5)], 0)
    assert msgspec.msgpack.decode(encode_batch(batch, "array"))[1] == [
        ["BlockStored", [H1], None, [7], 1, 5]
    ]
    assert decode_batch(encode_batch(_batch(), "array")) == _batch()
    with pytest.raises(ValueError, match="event_format"):
        encode_batch(_batch(), "json")  # type: ignore[arg-type]


def test_rank_zero_and_none_are_sent_explicitly() -> None:
    assert msgspec.msgpack.decode(encode_batch(_batch(rank=0)))[2] == 0
    raw = msgspec.msgpack.decode(encode_batch(_batch(rank=None)))
    assert len(raw) == 3 and raw[2] is None


def test_short_arrays_without_trailing_defaults_decode() -> None:
    payload = msgspec.msgpack.encode([1.0, [["BlockStored", [H1], None, [3, 4], 2]]])
    assert decode_batch(payload) == KVEventBatch(1.0, [BlockStored([H1], None, [3, 4], 2)])


def test_hand_built_sglang_payload_decodes() -> None:
    payload = msgspec.msgpack.encode(
        [
            5.5,
            [
                ["BlockStored", [H1], None, [1, 2], 2],
                ["BlockRemoved", [H1, H2]],
                ["AllBlocksCleared"],
            ],
            1,
        ]
    )
    assert decode_batch(payload) == KVEventBatch(
        5.5,
        [BlockStored([H1], None, [1, 2], 2), BlockRemoved([H1, H2]), AllBlocksCleared()],
        1,
    )


def test_unknown_event_tag_is_rejected() -> None:
    for event in (["BlockEvicted", [H1]], {"type": "BlockEvicted"}, 7):
        with pytest.raises(msgspec.ValidationError):
            decode_batch(msgspec.msgpack.encode([1.0, [event], 0]))
    with pytest.raises(msgspec.ValidationError):
        decode_batch(msgspec.msgpack.encode("not a batch"))
    with pytest.raises(msgspec.ValidationError):  # a field of the wrong type still fails
        decode_batch(msgspec.msgpack.encode([1.0, [{"type": "BlockRemoved", "block_hashes": "x"}]]))


def test_mixed_array_and_map_events_in_one_batch_decode() -> None:
    payload = msgspec.msgpack.encode(
        [1.0, [["BlockRemoved", [H1]], {"type": "BlockRemoved", "block_hashes": [H2], "x": 1}]]
    )
    assert decode_batch(payload).events == [BlockRemoved([H1]), BlockRemoved([H2])]


def test_int64_extremes_survive_the_wire() -> None:
    batch = KVEventBatch(0.0, [BlockRemoved([-(2**63), 2**63 - 1])], 0)
    assert decode_batch(encode_batch(batch)) == batch


# ---- sequence frames -------------------------------------------------------------------------


def test_seq_to_bytes_is_8_byte_big_endian() -> None:
    assert seq_to_bytes(0) == b"\x00" * 8
    assert seq_to_bytes(1) == b"\x00" * 7 + b"\x01"
    assert seq_to_bytes(256) == b"\x00" * 6 + b"\x01\x00"
    assert seq_to_bytes(2**63 - 1) == b"\x7f" + b"\xff" * 7


def test_seq_to_bytes_is_signed() -> None:
    assert seq_to_bytes(-1) == b"\xff" * 8  # the replay end marker
    with pytest.raises(OverflowError):
        seq_to_bytes(2**63)


def test_seq_from_bytes_is_big_endian_signed() -> None:
    assert seq_from_bytes(b"\x00" * 7 + b"\x02") == 2
    assert seq_from_bytes(b"\x01" + b"\x00" * 7) == 2**56
    assert seq_from_bytes(b"\xff" * 8) == -1
    assert seq_from_bytes(b"\x80" + b"\x00" * 7) == -(2**63)


@given(st.integers(-(2**63), 2**63 - 1))
def test_seq_round_trip(seq: int) -> None:
    frame = seq_to_bytes(seq)
    assert len(frame) == 8
    assert seq_from_bytes(frame) == seq


def test_event_format_names_parse_or_name_the_field() -> None:
    assert (parse_event_format("map"), parse_event_format("array")) == ("map", "array")
    with pytest.raises(ValueError, match="kv_events_format: expected one of map, array"):
        parse_event_format("msgpack", "kv_events_format")
