"""KVEventSubscriber against the engine's real publisher on 127.0.0.1: the mirror it feeds ends
equal to the publishing RadixCache after in-order streaming, a late join, dropped batches, a
replica restart (three ways) and an unreachable replay socket."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable

import pytest
import zmq
import zmq.asyncio

from radixserve.protocol import BlockStored, KVEventBatch, encode_batch
from radixserve.protocol.kv_events import seq_to_bytes
from radixserve.router.addresses import KVEndpoint
from radixserve.router.mirror.subscriber import KVEventSubscriber
from radixserve.router.mirror.tree import MirrorTree
from tests.ports import bind_retrying, free_port_pair
from tests.router.mirror.replica import (
    SYNC_TIMEOUT_S,
    Replica,
    engine_match,
    fresh_replica,
    until,
)

pytestmark = pytest.mark.timeout(90)


class Follower:
    """A MirrorTree fed by a KVEventSubscriber; records the seq of every batch it is fed."""

    def __init__(self, kv: KVEndpoint, ctx: zmq.asyncio.Context, page_size: int = 1, **kw) -> None:
        self.tree = MirrorTree(page_size)
        self.log: list[int | str] = []
        self.sub = KVEventSubscriber(kv, self._on_batch, self._on_reset, ctx, **kw)

    def _on_batch(self, batch: KVEventBatch) -> None:
        self.log.append(self.sub.last_seq)
        for event in batch.events:
            self.tree.apply(event)

    def _on_reset(self) -> None:
        self.log.append("reset")
        self.tree.clear()

    def fed_since_last_reset(self) -> list[int | str]:
        cut = max((i + 1 for i, x in enumerate(self.log) if x == "reset"), default=0)
        return self.log[cut:]


def prompt(rng: random.Random, systems: list[list[int]], n: int = 200) -> list[int]:
    return rng.choice(systems) + [rng.randrange(30_000) for _ in range(rng.randrange(n // 2, n))]


def in_sync(replica: Replica, f: Follower) -> bool:
    return (
        f.sub.last_seq == replica.last_seq
        and f.tree.cached_hashes() == replica.cache.cached_page_hashes()
    )


def assert_mirror_equals(replica: Replica, f: Follower, queries: list[list[int]]) -> None:
    assert f.tree.cached_hashes() == replica.cache.cached_page_hashes()
    f.tree.check_invariants()
    for q in queries:
        assert f.tree.match_prefix(q) == engine_match(replica.cache, q)


def run(scenario: Callable[[zmq.asyncio.Context], Awaitable[None]]) -> None:
    async def main() -> None:
        ctx = zmq.asyncio.Context()
        try:
            await scenario(ctx)
        finally:
            ctx.destroy(linger=0)

    asyncio.run(main())


class Scene:
    """Prompts with shared system prompts, and a counter of fresh ones for pokes."""

    def __init__(self, seed: int) -> None:
        self.rng = random.Random(seed)
        self.systems = [[self.rng.randrange(30_000) for _ in range(80)] for _ in range(3)]
        self.sent: list[list[int]] = []

    def send(self, replica: Replica, n: int = 200) -> None:
        self.sent.append(prompt(self.rng, self.systems, n))
        replica.insert(self.sent[-1])


async def join(replica: Replica, f: Follower, scene: Scene) -> None:
    """Publish until the follower has been fed (its SUB has joined the stream)."""
    f.sub.start()
    await until(lambda: f.sub.batches > 0, "stream joined", lambda: scene.send(replica))
    await until(lambda: in_sync(replica, f), "in sync after joining")


def test_live_batches_are_applied_in_order_through_evictions() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        replica, scene = fresh_replica(pool=3000), Scene(1)
        replica.serve()
        f = Follower(replica.kv, ctx)
        await join(replica, f, scene)
        replays = f.sub.replays  # ≤ 1: the history before the SUB joined
        for i in range(40):
            scene.send(replica)
            if i % 5 == 0:
                await asyncio.sleep(0)
        await until(lambda: in_sync(replica, f), "in sync")
        assert (replica.cache.evictable_size() + replica.cache.protected_size()) < sum(
            map(len, scene.sent)
        )  # evictions happened
        assert f.log == list(range(replica.last_seq + 1))  # each batch once, in order
        assert (f.sub.replays, f.sub.resets) == (replays, 0)
        assert_mirror_equals(replica, f, scene.sent)
        await f.sub.aclose()
        await replica.close()

    run(scenario)


def test_late_subscriber_gets_the_history_by_replay() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        replica, scene = fresh_replica(pool=3000), Scene(2)
        replica.serve()
        for _ in range(30):
            scene.send(replica)
        f = Follower(replica.kv, ctx)
        await join(replica, f, scene)
        assert f.sub.replays == 1 and f.sub.resets == 0
        assert f.log == list(range(replica.last_seq + 1))
        assert_mirror_equals(replica, f, scene.sent)
        await f.sub.aclose()
        await replica.close()

    run(scenario)


def test_batches_dropped_by_zmq_are_healed_by_replay() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        replica, scene = fresh_replica(pool=3000, hwm=1), Scene(3)
        replica.serve()
        f = Follower(replica.kv, ctx, rcvhwm=1)
        await join(replica, f, scene)
        replays = f.sub.replays
        # No await: the subscriber cannot read, both one-message queues and the socket buffers
        # fill up and the PUB socket drops batches (silently: PUB never blocks).
        for _ in range(200):
            scene.send(replica, 400)
        await until(lambda: in_sync(replica, f), "in sync after the gap")
        assert f.sub.replays > replays, "no gap: nothing was dropped"
        assert f.sub.resets == 0
        assert f.log == list(range(replica.last_seq + 1))
        assert_mirror_equals(replica, f, scene.sent[-50:])
        await f.sub.aclose()
        await replica.close()

    run(scenario)


@pytest.mark.parametrize("restart_batches", ["none", "as_many", "more"])
def test_a_restarted_replica_resets_the_mirror(restart_batches: str) -> None:
    """The new publisher starts again at seq 0. Batches it sends before the SUB reconnects are
    lost, so the first one seen may be ≤ our last seq (backwards), exactly the next one
    (caught on reconnection), or beyond (caught by the replay's history check)."""

    async def scenario(ctx: zmq.asyncio.Context) -> None:
        old, scene = fresh_replica(pool=3000), Scene(4)
        old.serve()
        f = Follower(old.kv, ctx)
        await join(old, f, scene)
        for _ in range(10):
            scene.send(old)
        await until(lambda: in_sync(old, f), "in sync with the first replica")
        last = old.last_seq
        await old.close()
        new = Replica(old.port, pool=3000)  # the same ports, as a restarted engine
        new.serve()
        early = {"none": 0, "as_many": last + 1, "more": last + 6}[restart_batches]
        for _ in range(early):  # sent at once: before the SUB reconnects
            scene.send(new, 40)
        await asyncio.sleep(0.5)
        scene.send(new, 40)
        await until(lambda: in_sync(new, f), "in sync with the restarted replica")
        assert f.sub.resets >= 1
        assert f.fed_since_last_reset() == list(range(new.last_seq + 1))
        assert_mirror_equals(new, f, scene.sent)
        await f.sub.aclose()
        await new.close()

    run(scenario)


@pytest.mark.parametrize("replay", ["unreachable", "none"])
def test_without_replay_the_mirror_resets_and_follows_the_stream(replay: str) -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        replica, scene = fresh_replica(pool=3000), Scene(5)
        replica.serve()
        for _ in range(10):
            scene.send(replica)
        dead = f"tcp://127.0.0.1:{free_port_pair()}" if replay == "unreachable" else None
        kv = KVEndpoint(0, replica.kv.endpoint, dead)
        f = Follower(kv, ctx, replay_timeout_s=0.3)
        f.sub.start()
        await until(lambda: f.sub.batches > 0, "stream", lambda: scene.send(replica))
        scene.send(replica)
        await until(lambda: f.sub.last_seq == replica.last_seq, "following the stream")
        assert f.sub.running and f.sub.resets == 1
        # unreachable: the sync on connect and the catch-up at the first live batch both tried
        assert f.sub.replays == (2 if replay == "unreachable" else 0)
        assert set(f.tree.cached_hashes()) <= set(replica.cache.cached_page_hashes())
        # Once the replica clears its cache (/flush_cache) the mirror is exact again.
        replica.cache.reset()
        replica.cache.allocator.clear()
        for _ in range(5):
            scene.send(replica)
        await until(lambda: in_sync(replica, f), "exact again after a clear")
        assert_mirror_equals(replica, f, scene.sent)
        await f.sub.aclose()
        await replica.close()

    run(scenario)


def test_a_warm_idle_replica_is_mirrored_on_connect() -> None:
    """A router (re)starting next to a replica that publishes nothing more still sees its cache."""

    async def scenario(ctx: zmq.asyncio.Context) -> None:
        replica, scene = fresh_replica(pool=3000), Scene(7)
        replica.serve()
        for _ in range(8):
            scene.send(replica)
        f = Follower(replica.kv, ctx)
        f.sub.start()
        await until(lambda: in_sync(replica, f), "in sync without a new batch")
        assert_mirror_equals(replica, f, scene.sent)
        assert (f.sub.replays, f.sub.resets) == (1, 0)
        scene.send(replica)  # the first live batch after the sync: applied once, in order
        await until(lambda: in_sync(replica, f), "following the stream")
        assert f.log == list(range(replica.last_seq + 1))
        await f.sub.aclose()
        await replica.close()

    run(scenario)


async def raw_stream(ctx: zmq.asyncio.Context) -> tuple[zmq.asyncio.Socket, Follower]:
    """A hand-driven publisher: an XPUB shows us the subscription, so nothing sent is lost."""
    xpub = ctx.socket(zmq.XPUB)
    xpub.setsockopt(zmq.LINGER, 0)
    endpoint = bind_retrying(lambda port: _bound(xpub, f"tcp://127.0.0.1:{port}"))
    f = Follower(KVEndpoint(0, endpoint), ctx)
    f.sub.start()
    assert (await asyncio.wait_for(xpub.recv(), SYNC_TIMEOUT_S))[:1] == b"\x01"
    return xpub, f


def _bound(sock: zmq.asyncio.Socket, endpoint: str) -> str:
    sock.bind(endpoint)
    return endpoint


def batch(*stored: tuple[int, int | None, int]) -> bytes:
    events = [BlockStored([h], parent, [tok], 1) for h, parent, tok in stored]
    return encode_batch(KVEventBatch(0.0, events))


def test_malformed_messages_are_skipped_and_the_stream_goes_on() -> None:
    async def scenario(ctx: zmq.asyncio.Context) -> None:
        xpub, f = await raw_stream(ctx)
        await xpub.send_multipart([b"", seq_to_bytes(0), b"\xc1 not msgpack"])
        await xpub.send_multipart([b"", seq_to_bytes(1)])  # two frames
        await xpub.send_multipart([b"", seq_to_bytes(1), batch((1, None, 5))])
        await until(lambda: f.sub.last_seq == 1, "the good batch")
        assert f.log == [1] and f.sub.running
        assert f.tree.match_prefix([5, 6]) == 1
        await f.sub.aclose()
        assert not f.sub.running
        xpub.close()

    run(scenario)


def test_seq_going_back_on_the_same_connection_is_a_restart() -> None:
    """E.g. behind a ZMQ forwarder the router never sees the replica's connection drop."""

    async def scenario(ctx: zmq.asyncio.Context) -> None:
        xpub, f = await raw_stream(ctx)
        for seq, payload in enumerate([batch((1, None, 5)), batch((2, 1, 6)), batch((3, 2, 7))]):
            await xpub.send_multipart([b"", seq_to_bytes(seq), payload])
        await until(lambda: f.sub.last_seq == 2, "the first history")
        assert f.tree.match_prefix([5, 6, 7]) == 3
        await xpub.send_multipart([b"", seq_to_bytes(0), batch((9, None, 8))])
        await xpub.send_multipart([b"", seq_to_bytes(1), batch((10, 9, 5))])
        await until(lambda: f.sub.last_seq == 1 and f.sub.batches == 5, "the new history")
        assert f.log == [0, 1, 2, "reset", 0, 1] and f.sub.resets == 1
        assert (f.tree.match_prefix([5, 6, 7]), f.tree.match_prefix([8, 5])) == (0, 2)
        await f.sub.aclose()
        xpub.close()

    run(scenario)
