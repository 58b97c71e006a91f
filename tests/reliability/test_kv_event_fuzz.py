"""Bad input on the router's SUB socket: the KV-event decoder and the subscriber under
hypothesis-generated garbage, truncated payloads, out-of-order and replayed batches.

Oracles: msgspec's own error types (the only ones the subscriber catches) for the decoder; the
engine's RadixCache behind the engine's real publisher for the mirror (after the stream goes
on, the mirror equals the replica's cache, whatever was injected before).
"""

from __future__ import annotations

import asyncio
import random
from typing import Any

import msgspec
import pytest
import zmq
import zmq.asyncio
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from radixserve.protocol import AllBlocksCleared, BlockRemoved, BlockStored, KVEventBatch
from radixserve.protocol.kv_events import decode_batch, encode_batch, seq_to_bytes
from tests.router.mirror.replica import Replica, fresh_replica, until
from tests.router.mirror.test_subscriber import Follower, in_sync

pytestmark = pytest.mark.timeout(600)

_LEAF = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)  # what msgpack can carry
    | st.floats(allow_nan=True)
    | st.text(max_size=12)
    | st.binary(max_size=12)
    | st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared", "type", "events"])
)
_MSGPACK = st.recursive(
    _LEAF,
    lambda inner: st.lists(inner, max_size=5)
    | st.dictionaries(
        st.sampled_from(["type", "ts", "events", "block_hashes", "parent_block_hash",
                         "token_ids", "block_size", "attn_dp_rank"]) | st.text(max_size=6),
        inner,
        max_size=5,
    ),
    max_leaves=20,
)  # fmt: skip
_EVENT = st.one_of(
    st.builds(
        BlockStored,
        st.lists(st.integers(-(2**63), 2**63 - 1), min_size=1, max_size=3),
        st.none() | st.integers(-(2**63), 2**63 - 1),
        st.lists(st.integers(0, 2**32 - 1), min_size=1, max_size=6),
        st.integers(1, 4),
    ),
    st.builds(BlockRemoved, st.lists(st.integers(-(2**63), 2**63 - 1), max_size=3)),
    st.just(AllBlocksCleared()),
)
_REAL_PAYLOAD = st.builds(
    lambda events, fmt: encode_batch(KVEventBatch(0.0, events), fmt),
    st.lists(_EVENT, max_size=4),
    st.sampled_from(["map", "array"]),
)


def _structure_shaped(value: Any) -> bytes:
    return msgspec.msgpack.encode(value)


PAYLOADS = st.one_of(
    st.binary(max_size=64),  # garbage
    _MSGPACK.map(_structure_shaped),  # well-formed msgpack of any shape
    st.builds(lambda p, cut: p[: max(0, len(p) - cut)], _REAL_PAYLOAD, st.integers(1, 40)),
    _REAL_PAYLOAD,  # decodes, but describes blocks the replica never had
)


@settings(max_examples=500, deadline=None)
@given(payload=PAYLOADS)
def test_decoder_raises_only_msgspec_errors(payload: bytes) -> None:
    try:
        batch = decode_batch(payload)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return
    assert isinstance(batch, KVEventBatch)
    assert all(isinstance(e, BlockStored | BlockRemoved | AllBlocksCleared) for e in batch.events)


# ---- the subscriber against a real publisher, with frames injected on its socket -------------

SEQ_KINDS = ("next", "same", "past", "future", "far", "negative", "bad_frames")
INJECTION = st.tuples(st.sampled_from(SEQ_KINDS), PAYLOADS)
STEPS = st.lists(
    st.integers(1, 40).map(lambda n: ("insert", n)) | INJECTION.map(lambda x: ("inject", x)),
    min_size=1,
    max_size=12,
)  # fmt: skip


def _inject(replica: Replica, kind: str, payload: bytes, rng: random.Random) -> None:
    """One frame set on the replica's own PUB socket, numbered by `kind` (against its next seq)."""
    nxt = replica.pub.next_seq
    if kind == "past" and replica.pub.buffer:  # a real earlier batch, replayed as is
        seq, payload = rng.choice(list(replica.pub.buffer))
    else:
        seq = {
            "next": nxt,
            "same": max(nxt - 1, 0),
            "past": 0,
            "future": nxt + rng.randrange(1, 5),
            "far": nxt + 10_000,
            "negative": -rng.randrange(1, 10),
            "bad_frames": nxt,
        }[kind]
    frames = [replica.pub.topic, seq_to_bytes(seq), payload]
    if kind == "bad_frames":
        frames = frames[: rng.randrange(1, 3)] + ([b"x"] if rng.random() < 0.5 else [])
    replica.pub.pub.send_multipart(frames)


@settings(
    max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None
)
@given(steps=STEPS, seed=st.integers(0, 2**16))
# Found by this test: a stray frame reusing the newest seq (0) looked like a publisher restart,
# and the mirror was rebuilt from that frame alone (the real batch 0 was lost for good).
@example(steps=[("inject", ("same", b"")), ("insert", 10)], seed=35198)
def test_subscriber_survives_injected_frames_and_ends_equal(
    steps: list[tuple[str, Any]], seed: int
) -> None:
    asyncio.run(_scenario(steps, seed))


async def _scenario(steps: list[tuple[str, Any]], seed: int) -> None:
    rng = random.Random(seed)
    ctx = zmq.asyncio.Context()
    replica = fresh_replica()
    replica.serve()
    f = Follower(replica.kv, ctx)
    try:
        f.sub.start()
        base = [rng.randrange(30_000) for _ in range(30)]
        await until(lambda: f.sub.batches > 0, "joined", lambda: replica.insert(base))
        for op, arg in steps:
            if op == "insert":
                replica.insert(
                    base[: rng.randrange(1, 30)] + [rng.randrange(30_000) for _ in range(arg)]
                )
            else:
                _inject(replica, arg[0], arg[1], rng)
            await asyncio.sleep(0)
        # the stream goes on: the mirror catches up with the replica, whatever came before
        await until(
            lambda: in_sync(replica, f),
            "mirror equal to the replica",
            lambda: replica.insert([rng.randrange(30_000) for _ in range(5)]),
        )
        assert f.sub.running
        f.tree.check_invariants()
    finally:
        await f.sub.aclose()
        await replica.close()
        ctx.destroy(linger=0)
