"""KVEventSubscriber: follows one rank's KV-event stream and keeps its mirror in step.

One asyncio task per rank (zmq.asyncio, no thread). The publisher numbers its batches from 0
(engine `ZmqKVEventPublisher`, SGLang's `ZmqEventPublisher`); frames are
`[topic, seq (8-byte big-endian signed), msgpack KVEventBatch]`. Per live batch:
- On connect, the replay socket's whole buffer is applied first (a warm, idle rank is
  mirrored at once, not at its next batch).
- seq = last + 1: apply it.
- a gap (seq > last + 1), or a first batch that is not seq 0: fetch the missing batches from the
  replay socket (a DEALER: send the 8-byte start seq, read `[seq, payload]` until seq -1), apply
  them in order, then the live one. Live batches the replay already delivered are skipped
  (same seq and same payload).
- seq ≤ last (and not such a duplicate): the publisher restarted. Reset the mirror (`on_reset`)
  and start over from this batch, replaying from 0 first when its seq is not 0.
Two checks catch a restart whose new seqs do not go backwards: every replay starts at our
last applied batch and must return it unchanged, and after the SUB socket reconnects (seen on
a socket monitor) the next batch is verified that way even when its seq looks contiguous.
When a replay fails or times out (or there is no replay endpoint) the mirror is reset and
follows the live stream from the current batch; it then under-estimates the cache (blocks
below unknown parents wait as orphans) until the rank clears or re-stores them. Logged.
A publisher that goes away is reconnected to by ZMQ; dropping the rank is the owner's call.
A dropped connection (the socket monitor's DISCONNECTED, watched beside the stream) sets
`stream_lost`: the owner routes on its approximate view until the connection is back and the
batches sent meanwhile have been taken from the replay.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable

import msgspec
import zmq
import zmq.asyncio
from zmq.utils.monitor import parse_monitor_message

from radixserve.protocol.kv_events import KVEventBatch, decode_batch, seq_from_bytes, seq_to_bytes
from radixserve.router.addresses import KVEndpoint

logger = logging.getLogger(__name__)

RCVHWM = 100_000  # batches queued on our side before ZMQ drops (a gap we then replay)
REPLAY_TIMEOUT_S = 5.0
YIELD_EVERY_S = 0.005  # longest run of batch applying before the router's requests get a turn


class KVEventSubscriber:
    """Feeds `on_batch` every batch of one KV-event stream, in seq order, exactly once; calls
    `on_reset` when what was fed before no longer describes the rank."""

    def __init__(  # noqa: PLR0913 - the stream, its two callbacks and three transport knobs
        self,
        endpoint: KVEndpoint,
        on_batch: Callable[[KVEventBatch], None],
        on_reset: Callable[[], None],
        ctx: zmq.asyncio.Context,
        replay_timeout_s: float = REPLAY_TIMEOUT_S,
        rcvhwm: int = RCVHWM,
        name: str = "",
    ) -> None:
        if replay_timeout_s <= 0:
            raise ValueError(f"replay_timeout_s: must be > 0, got {replay_timeout_s}")
        self.endpoint = endpoint
        self.name = name or endpoint.endpoint
        self.last_seq = -1
        self.resets = 0
        self.replays = 0
        self.batches = 0
        self._on_batch = on_batch
        self._on_reset = on_reset
        self._ctx = ctx
        self._replay_timeout_s = replay_timeout_s
        self._rcvhwm = rcvhwm
        self._last_payload: bytes | None = None
        self._expected: dict[int, bytes] = {}  # replayed batches the live stream will repeat
        self._reconnected = False
        self._task: asyncio.Task[None] | None = None
        self._last_yield = 0.0
        # set once the replay buffer taken at connect is applied (or the task ended): the
        # owner waits for it before routing to the rank (see WorkerRegistry.mark_healthy)
        self.synced = asyncio.Event()
        # the SUB connection dropped and has not come back (or not caught up yet): the mirror
        # is frozen, so the owner routes on its approximate view meanwhile
        self.stream_lost = False
        self.stream_losses = 0
        self._resync_due = False

    # ---- lifecycle ----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the task (needs a running event loop); a second call does nothing."""
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(
                self._run(), name=f"kv-events {self.name}"
            )

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    async def aclose(self) -> None:
        task, self._task = self._task, None
        if task is None:
            return
        # Cancel until it ends: Python 3.11's asyncio.wait_for (in _replay) can swallow a
        # cancellation that lands as its inner await completes, and the loop would run on.
        while not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=1.0)
        if not task.cancelled():
            task.result()  # an error that ended the stream surfaces here, as before

    # ---- the stream ---------------------------------------------------------------------------

    def _socket(self, kind: int) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(kind)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.IPV6, 1)  # also dials IPv4; needed for tcp://[v6]:port
        return sock

    async def _run(self) -> None:
        sub = self._socket(zmq.SUB)
        sub.setsockopt(zmq.RCVHWM, self._rcvhwm)
        sub.setsockopt(zmq.SUBSCRIBE, self.endpoint.topic.encode())
        monitor = sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED | zmq.EVENT_DISCONNECTED)
        try:
            try:
                sub.connect(self.endpoint.endpoint)
            except zmq.ZMQError as exc:  # e.g. a malformed endpoint: nothing to retry
                logger.error("KV events %s: cannot connect: %s", self.name, exc)
                return
            await self._initial_sync()
            self.synced.set()
            poller = zmq.asyncio.Poller()  # the monitor too: a lost stream sends no batch
            poller.register(sub, zmq.POLLIN)
            poller.register(monitor, zmq.POLLIN)
            while True:
                ready = dict(await poller.poll())
                await self._drain_monitor(monitor)
                if self._resync_due:
                    await self._resync()
                if sub not in ready:
                    continue
                frames = await sub.recv_multipart()
                try:
                    await self._on_message(frames)
                except Exception:  # a bad batch must not end the stream
                    logger.exception("KV events %s: could not handle a batch", self.name)
                if self.stream_lost and not self._resync_due:  # caught up by that batch
                    self.stream_lost = False
                await self._share_loop()
        finally:
            self.synced.set()  # nothing more will come: waiters must not wait for ever
            with contextlib.suppress(zmq.ZMQError):  # the context may be gone already
                sub.disable_monitor()
            monitor.close(linger=0)
            sub.close(linger=0)

    async def _initial_sync(self) -> None:
        """Take what the rank holds now from its publisher's replay buffer, without waiting for its
        next batch: an idle rank may publish nothing for a long time, and a router that starts
        (or restarts) next to warm workers should see their caches at once."""
        history = await self._replay(0)
        if not history:
            return
        if history[0][0] != 0:
            logger.warning(
                "KV events %s: batches before %d are no longer buffered by the publisher; "
                "the mirror starts from there",
                self.name,
                history[0][0],
            )
        for seq, payload in history:
            self._expected[seq] = payload  # the live stream may repeat the newest of these
            self._apply(seq, payload)
            await self._share_loop()

    async def _drain_monitor(self, monitor: zmq.asyncio.Socket) -> None:
        """ZMQ reports a (re)connection before delivering that connection's messages."""
        while True:
            try:
                frames = await monitor.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            event = parse_monitor_message(frames)["event"]
            if event == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._reconnected = True
                self._resync_due = self.stream_lost
            elif event == zmq.EVENT_DISCONNECTED and not self.stream_lost:
                self.stream_lost = True
                self.stream_losses += 1
                logger.warning(
                    "KV events %s: stream lost; routing on the approximate view until it returns",
                    self.name,
                )

    async def _resync(self) -> None:
        """The stream is back after a loss: take what was published meanwhile from the replay
        (batches sent while we were away are gone from the live stream), then trust the mirror
        again. If the replay fails, the next live batch catches up instead (`_reconnected`)."""
        self._resync_due = False
        history = await self._replay(max(self.last_seq, 0))
        if history is not None and self.last_seq >= 0 and not self._continues(history):
            logger.warning("KV events %s: publisher restarted while away: mirror reset", self.name)
            self._reset()
            history = await self._replay(0)
        if history is None:
            return
        for seq, payload in history:
            self._expected[seq] = payload  # the live stream may repeat the newest of these
            if seq > self.last_seq:
                self._apply(seq, payload)
                await self._share_loop()
        self._reconnected = False  # verified just now
        self.stream_lost = False
        logger.info("KV events %s: stream back at batch %d", self.name, self.last_seq)

    async def _on_message(self, frames: list[bytes]) -> None:
        if len(frames) != 3 or len(frames[1]) != 8:
            logger.warning("KV events %s: malformed message (%d frames)", self.name, len(frames))
            return
        seq, payload = seq_from_bytes(frames[1]), frames[2]
        if seq < 0:
            logger.warning("KV events %s: negative seq %d ignored", self.name, seq)
            return
        verify = self._reconnected and self.last_seq >= 0
        self._reconnected = False
        if not verify:
            if self._expected.pop(seq, None) == payload:
                return  # a replay delivered it already
            if seq == self.last_seq + 1:
                self._expected.clear()
                self._apply(seq, payload)
                return
            if seq <= self.last_seq:
                logger.warning(
                    "KV events %s: seq %d after %d: the publisher restarted, mirror reset",
                    self.name,
                    seq,
                    self.last_seq,
                )
                # Rebuilt from the publisher's replay, not from this batch alone: a stray
                # frame that reuses a sequence number looks the same as a restart, and the
                # replay holds the publisher's real batches (a restarted one's included).
                self._reset()
                await self._catch_up(seq, payload, already_reset=True)
                return
        await self._catch_up(seq, payload)

    async def _catch_up(self, seq: int, payload: bytes, already_reset: bool = False) -> None:
        """Apply what precedes the live batch `seq` (by replay), then the batch itself."""
        self._expected.clear()
        history = await self._replay(max(self.last_seq, 0))
        if history is not None and self.last_seq >= 0 and not self._continues(history):
            logger.warning(
                "KV events %s: the publisher's history no longer holds our batch %d "
                "(restart, or too far behind): mirror reset",
                self.name,
                self.last_seq,
            )
            self._reset()
            already_reset = True
            history = await self._replay(0)
        if history is None:
            logger.warning(
                "KV events %s: replay failed; mirror reset, following the live stream from %d",
                self.name,
                seq,
            )
            if not already_reset:
                self._reset()
            self._apply(seq, payload)
            return
        if self.last_seq < 0 and (not history or history[0][0] != 0):
            logger.warning(
                "KV events %s: batches before %s are no longer buffered by the publisher; "
                "the mirror starts from there",
                self.name,
                history[0][0] if history else seq,
            )
        for s, p in history:
            if s <= self.last_seq:
                continue
            if s > seq:
                self._expected[s] = p
            self._apply(s, p)
            await self._share_loop()
        if seq > self.last_seq:
            self._apply(seq, payload)

    async def _share_loop(self) -> None:
        """Yield to the event loop now and then: queued or replayed batches arrive without
        waiting, and applying thousands in a row would stall the router's requests."""
        now = time.monotonic()
        if now - self._last_yield > YIELD_EVERY_S:
            await asyncio.sleep(0)
            self._last_yield = time.monotonic()

    def _continues(self, history: list[tuple[int, bytes]]) -> bool:
        return bool(history) and history[0] == (self.last_seq, self._last_payload)

    async def _replay(self, start: int) -> list[tuple[int, bytes]] | None:
        """Batches with seq ≥ start from the replay socket, or None (no endpoint, timeout)."""
        if not self.endpoint.replay_endpoint:
            return None
        self.replays += 1
        timeout_ms = int(self._replay_timeout_s * 1000)
        sock = self._socket(zmq.DEALER)
        try:
            sock.connect(self.endpoint.replay_endpoint)
            await asyncio.wait_for(
                sock.send_multipart([b"", seq_to_bytes(start)]), self._replay_timeout_s
            )
            out: list[tuple[int, bytes]] = []
            while await sock.poll(timeout_ms):  # flags default to POLLIN
                frames = await sock.recv_multipart()
                if len(frames) < 2 or len(frames[-2]) != 8:
                    return None
                seq = seq_from_bytes(frames[-2])
                if seq == -1:
                    return out
                out.append((seq, frames[-1]))
            return None
        except (asyncio.TimeoutError, zmq.ZMQError) as exc:
            logger.warning("KV events %s: replay from %d: %r", self.name, start, exc)
            return None
        finally:
            sock.close(linger=0)

    # ---- applying -----------------------------------------------------------------------------

    def _apply(self, seq: int, payload: bytes) -> None:
        self.last_seq, self._last_payload = seq, payload
        self.batches += 1
        try:
            batch = decode_batch(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            logger.warning("KV events %s: undecodable batch %d skipped: %s", self.name, seq, exc)
            return
        try:
            self._on_batch(batch)
        except Exception:  # the owner's callback: log it, keep following the stream
            logger.exception("KV events %s: on_batch failed on batch %d", self.name, seq)

    def _reset(self) -> None:
        self.resets += 1
        self.last_seq, self._last_payload = -1, None
        self._expected.clear()
        try:
            self._on_reset()
        except Exception:
            logger.exception("KV events %s: on_reset failed", self.name)
