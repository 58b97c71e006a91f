"""ZmqKVEventPublisher: PUB stream with consecutive seqs, replay protocol, ring-buffer bound."""

from __future__ import annotations

import time
from collections.abc import Iterator

import msgspec
import pytest
import zmq

from radixserve.engine.scheduler.kv_event_publisher import ZmqKVEventPublisher
from radixserve.protocol import AllBlocksCleared, BlockRemoved, BlockStored
from radixserve.protocol.kv_events import decode_batch, seq_from_bytes, seq_to_bytes
from tests.ports import bind_retrying

TIMEOUT_MS = 5000


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def make_pub(ctx: zmq.Context, **kw: object) -> ZmqKVEventPublisher:
    """A publisher on two fresh ports (PUB, replay), chosen again if another process binds
    one first."""

    def at(port: int) -> ZmqKVEventPublisher:
        return ZmqKVEventPublisher("127.0.0.1", port, ctx=ctx, **kw)  # type: ignore[arg-type]

    return bind_retrying(at, 2)


def subscriber(ctx: zmq.Context, pub: ZmqKVEventPublisher) -> zmq.Socket:
    """A SUB socket that is provably joined: probe batches are published until one arrives."""
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.setsockopt(zmq.LINGER, 0)
    sub.connect(pub.endpoint)
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while time.monotonic() < deadline:
        pub.publish([])
        if sub.poll(50):
            while sub.poll(50):  # drain the probes
                sub.recv_multipart()
            return sub
    raise TimeoutError("SUB never joined")


def recv(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(TIMEOUT_MS), "timed out waiting for a message"
    return sock.recv_multipart()


def replay(ctx: zmq.Context, pub: ZmqKVEventPublisher, start: int, kind: int = zmq.DEALER):
    """Ask the replay socket from `start`; serve it from the publisher; return [(seq, payload)]."""
    client = ctx.socket(kind)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(pub.replay_endpoint)
    if kind == zmq.DEALER:
        client.send_multipart([b"", seq_to_bytes(start)])
    else:
        client.send(seq_to_bytes(start))
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while pub.serve_replay(20) == 0:
        assert time.monotonic() < deadline, "replay request never arrived"
    out = []
    while True:
        frames = recv(client)
        if kind == zmq.DEALER:
            assert frames[0] == b""
            frames = frames[1:]
        seq_b, payload = frames
        seq = seq_from_bytes(seq_b)
        if seq == -1:
            assert payload == b""
            break
        out.append((seq, payload))
        if kind == zmq.REQ:  # a REQ socket takes one reply per request
            break
    client.close()
    return out


STORED = BlockStored([11], None, [1, 2, 3], 3)


def test_stream_has_consecutive_seqs_from_zero_and_decodable_payloads(ctx: zmq.Context) -> None:
    pub = make_pub(ctx)
    sub = ctx.socket(zmq.SUB)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(pub.endpoint)
    time.sleep(0.5)  # slow joiner: the first batch must reach the stream, not only the buffer
    batches = [[AllBlocksCleared()], [STORED], [BlockRemoved([11]), AllBlocksCleared()]]
    before = time.time()
    for events in batches:
        pub.publish(events)
    for want_seq, events in enumerate(batches):
        topic, seq_b, payload = recv(sub)
        assert topic == b"" and len(seq_b) == 8
        assert seq_from_bytes(seq_b) == want_seq
        batch = decode_batch(payload)
        assert batch.events == events
        assert batch.attn_dp_rank == 0
        assert before <= batch.ts <= time.time()
    pub.close()


def test_flush_publishes_cache_events_once_and_skips_empty(ctx: zmq.Context) -> None:
    class FakeCache:
        def __init__(self) -> None:
            self.events: list = [AllBlocksCleared()]  # what reset() records at construction

        def take_events(self) -> list:
            out, self.events = self.events, []
            return out

    pub = make_pub(ctx)
    cache = FakeCache()
    flush = pub.make_flush(lambda: cache)
    flush()
    flush()  # nothing new: no empty batch
    cache.events = [STORED]
    flush()
    pub.make_flush(lambda: object())()  # a cache without take_events: nothing to publish
    assert [s for s, _ in pub.buffer] == [0, 1]
    assert decode_batch(pub.buffer[0][1]).events == [AllBlocksCleared()]
    assert decode_batch(pub.buffer[1][1]).events == [STORED]
    pub.close()


def test_replay_returns_buffered_batches_from_seq_then_end_marker(ctx: zmq.Context) -> None:
    pub = make_pub(ctx)
    payloads = {}
    for i in range(6):
        seq = pub.publish([BlockStored([i], None, [i], 1)])
        payloads[seq] = pub.buffer[-1][1]
    got = replay(ctx, pub, 3)
    assert [s for s, _ in got] == [3, 4, 5]
    assert all(payloads[s] == p for s, p in got)
    assert decode_batch(got[0][1]).events == [BlockStored([3], None, [3], 1)]
    assert [s for s, _ in replay(ctx, pub, 0)] == list(range(6))
    assert replay(ctx, pub, 6) == []  # up to date: only the end marker
    assert [s for s, _ in replay(ctx, pub, 0, kind=zmq.REQ)] == [0]  # REQ framing works too
    pub.close()


def test_ring_buffer_keeps_only_the_newest_batches(ctx: zmq.Context) -> None:
    pub = make_pub(ctx, buffer_steps=5)
    for _ in range(12):
        pub.publish([STORED])
    assert len(pub.buffer) == 5
    assert [s for s, _ in replay(ctx, pub, 0)] == [7, 8, 9, 10, 11]
    assert [s for s, _ in replay(ctx, pub, 10)] == [10, 11]
    pub.close()


def test_full_default_buffer_replays_without_drops(ctx: zmq.Context) -> None:
    pub = make_pub(ctx)
    n = pub.buffer.maxlen
    assert n == 10000
    for i in range(n + 50):
        pub.publish([BlockRemoved([i])])
    got = replay(ctx, pub, 0)
    assert [s for s, _ in got] == list(range(50, n + 50))
    pub.close()


def test_dp_rank_offsets_ports_and_tags_batches(ctx: zmq.Context) -> None:
    bases: list[int] = []

    def rank_1(base: int) -> ZmqKVEventPublisher:
        bases.append(base)
        return ZmqKVEventPublisher("127.0.0.1", base, dp_rank=1, ctx=ctx)

    pub = bind_retrying(rank_1, 4)  # rank 0's two ports, then rank 1's
    assert pub.endpoint == f"tcp://127.0.0.1:{bases[-1] + 2}"
    assert pub.replay_endpoint == f"tcp://127.0.0.1:{bases[-1] + 3}"
    sub = subscriber(ctx, pub)
    seq = pub.publish([STORED])
    frames = recv(sub)
    assert seq_from_bytes(frames[1]) == seq
    assert decode_batch(frames[2]).attn_dp_rank == 1
    pub.close()


def test_port_in_use_raises_and_malformed_request_gets_end_marker(ctx: zmq.Context) -> None:
    pub = make_pub(ctx)
    with pytest.raises(zmq.ZMQError):
        ZmqKVEventPublisher("127.0.0.1", pub.port, ctx=ctx)
    client = ctx.socket(zmq.DEALER)
    client.setsockopt(zmq.LINGER, 0)
    client.connect(pub.replay_endpoint)
    client.send_multipart([b"", b"bad"])
    deadline = time.monotonic() + TIMEOUT_MS / 1000
    while pub.serve_replay(20) == 0:
        assert time.monotonic() < deadline
    assert recv(client) == [b"", seq_to_bytes(-1), b""]
    client.close()
    pub.close()


def test_array_format_publishes_sglang_056s_positional_events(ctx: zmq.Context) -> None:
    pub = make_pub(ctx, event_format="array")
    pub.publish([STORED])
    ((seq, payload),) = replay(ctx, pub, 0)
    assert seq == 0
    assert msgspec.msgpack.decode(payload)[1] == [["BlockStored", [11], None, [1, 2, 3], 3, None]]
    assert decode_batch(payload).events == [STORED]
    pub.close()
    with pytest.raises(ValueError, match="event_format"):
        make_pub(ctx, event_format="json")
