"""Publishes the radix cache's KV events over ZMQ, wire-compatible with SGLang's publisher.

One publisher per DP rank, owned by that rank's attention-TP rank 0 (the other TP ranks of
the rank hold the same cache and publish nothing). PUB on port + 2 × dp_rank and replay on
the next port:
- PUB on tcp://host:port: each batch as frames `[topic, seq (8-byte big-endian signed),
  payload (msgpack KVEventBatch, tagged-map events; `event_format="array"` for SGLang 0.5.6
  consumers)]`; seq counts from 0 per publisher (a restart starts again
  at 0, which tells subscribers to reset their mirror).
- ROUTER on tcp://host:port+1 (replay): a REQ/DEALER client sends one frame holding the
  8-byte start seq; it gets one message `[seq, payload]` per buffered batch with seq ≥ start,
  then the end marker `[-1, b""]` (each behind the client's envelope, e.g. identity + b"").

Single-threaded by design: the scheduler loop calls `flush()` once per iteration (idle ones
included), which publishes what the cache recorded since the last call and then answers
pending replay requests without blocking. So no lock guards the ring buffer.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

import zmq

from radixserve.protocol.kv_events import (
    KVCacheEvent,
    KVEventBatch,
    encode_batch,
    parse_event_format,
    seq_from_bytes,
    seq_to_bytes,
)

logger = logging.getLogger(__name__)

BUFFER_STEPS = 10000  # batches kept for replay
SNDHWM = 100000  # PUB high-water mark: beyond it ZMQ drops messages (subscribers replay)
END_SEQ = seq_to_bytes(-1)
MAX_REPLAYS_PER_FLUSH = 64  # bound the time one flush spends serving replay requests


def port_for_rank(base_port: int, dp_rank: int) -> int:
    """PUB port of a DP rank (its replay port is this + 1)."""
    return base_port + 2 * dp_rank


def _tcp(host: str, port: int) -> str:
    return f"tcp://[{host}]:{port}" if ":" in host else f"tcp://{host}:{port}"


class ZmqKVEventPublisher:
    def __init__(  # noqa: PLR0913 - mirrors SGLang's KVEventsConfig knobs
        self,
        host: str,
        port: int,
        dp_rank: int = 0,
        buffer_steps: int = BUFFER_STEPS,
        hwm: int = SNDHWM,
        topic: bytes = b"",
        ctx: zmq.Context[Any] | None = None,
        event_format: str = "map",  # "array": SGLang 0.5.6's positional events
    ) -> None:
        if buffer_steps < 1:
            raise ValueError(f"buffer_steps: must be ≥ 1, got {buffer_steps}")
        self.event_format = parse_event_format(event_format)
        self.dp_rank = dp_rank
        self.topic = topic
        self.port = port_for_rank(port, dp_rank)
        self.replay_port = self.port + 1
        self.endpoint = _tcp(host, self.port)
        self.replay_endpoint = _tcp(host, self.replay_port)
        self._own_ctx = ctx is None
        self.ctx = ctx or zmq.Context()
        self.buffer: deque[tuple[int, bytes]] = deque(maxlen=buffer_steps)
        self.next_seq = 0
        self.pub = self.ctx.socket(zmq.PUB)
        self.replay = self.ctx.socket(zmq.ROUTER)
        try:
            for sock in (self.pub, self.replay):
                sock.setsockopt(zmq.LINGER, 0)
                if ":" in host:
                    sock.setsockopt(zmq.IPV6, 1)
            self.pub.setsockopt(zmq.SNDHWM, hwm)
            # A ROUTER silently drops messages to a peer whose pipe is full: leave room for a
            # whole-buffer replay (plus end marker) to several requests at once.
            self.replay.setsockopt(zmq.SNDHWM, max(hwm, 4 * (buffer_steps + 1)))
            self.pub.bind(self.endpoint)
            self.replay.bind(self.replay_endpoint)
        except zmq.ZMQError:
            self.close()
            raise

    # ---- publishing ---------------------------------------------------------------------------

    def publish(self, events: Sequence[KVCacheEvent]) -> int:
        """Send one batch; returns its seq."""
        batch = KVEventBatch(ts=time.time(), events=list(events), attn_dp_rank=self.dp_rank)
        payload = encode_batch(batch, self.event_format)
        seq = self.next_seq
        self.next_seq += 1
        self.buffer.append((seq, payload))
        # A PUB socket never blocks or raises at its high-water mark: it drops the message for
        # that subscriber, which sees the seq gap and replays from the ring buffer.
        self.pub.send_multipart((self.topic, seq_to_bytes(seq), payload), flags=zmq.NOBLOCK)
        return seq

    # ---- replay -------------------------------------------------------------------------------

    def serve_replay(self, timeout_ms: int = 0) -> int:
        """Answer the replay requests already waiting (waits at most timeout_ms for the first);
        returns how many were answered."""
        served = 0
        while served < MAX_REPLAYS_PER_FLUSH and self.replay.poll(timeout_ms, zmq.POLLIN):
            timeout_ms = 0
            frames = self.replay.recv_multipart()
            self._answer(frames)
            served += 1
        return served

    def _answer(self, frames: list[bytes]) -> None:
        # ROUTER prefixes the peer identity; REQ (and well-behaved DEALERs) add b"".
        envelope, body = frames[:-1], frames[-1]
        if len(body) != 8:
            logger.warning("KV events: malformed replay request (%d-byte body)", len(body))
            self._send(envelope, END_SEQ, b"")
            return
        start = seq_from_bytes(body)
        for seq, payload in list(self.buffer):
            if seq >= start:
                self._send(envelope, seq_to_bytes(seq), payload)
        self._send(envelope, END_SEQ, b"")

    def _send(self, envelope: list[bytes], seq: bytes, payload: bytes) -> None:
        try:
            self.replay.send_multipart([*envelope, seq, payload], flags=zmq.NOBLOCK)
        except zmq.Again:
            logger.warning("KV events: replay client too slow, reply truncated")

    # ---- scheduler hook -----------------------------------------------------------------------

    def flush_from(self, tree_cache: Any) -> None:
        """Publish what the cache recorded since the last call, then serve replay requests."""
        take = getattr(tree_cache, "take_events", None)
        events = take() if take is not None else []
        if events:
            self.publish(events)
        self.serve_replay(0)

    def make_flush(self, get_tree_cache: Callable[[], Any]) -> Callable[[], None]:
        """The zero-argument function SchedulerLoop calls once per iteration."""
        return lambda: self.flush_from(get_tree_cache())

    def close(self) -> None:
        for sock in (self.pub, self.replay):
            sock.close(linger=0)
        if self._own_ctx:
            self.ctx.term()
