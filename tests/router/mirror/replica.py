"""Test stand-in for one engine replica's KV-event side: the engine's real RadixCache (events
on) and its real ZmqKVEventPublisher on 127.0.0.1, with no model behind them."""

from __future__ import annotations

import asyncio
import contextlib
import time
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import torch

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.scheduler.kv_event_publisher import ZmqKVEventPublisher
from radixserve.router.addresses import KVEndpoint
from tests.ports import bind_retrying

CPU = torch.device("cpu")
SYNC_TIMEOUT_S = 20.0


def make_cache(page_size: int, pool: int) -> RadixCache:
    return RadixCache(
        ReqToTokenPool(2, 8, CPU),
        create_allocator(pool, page_size, CPU),
        page_size=page_size,
        eviction_policy="lru",
        enable_events=True,
    )


def cache_insert(cache: RadixCache, tokens: Sequence[int]) -> None:
    """Insert the page-aligned part of tokens as a finished request would, evicting if needed."""
    key = list(tokens[: len(tokens) // cache.page_size * cache.page_size])
    if not key:
        return
    short = len(key) - cache.allocator.available_size()
    if short > 0:
        cache.evict(short)
    slots = cache.allocator.alloc_extend([0], [len(key)], [-1])
    if slots is None:  # locked pages leave too little room: skip this one
        return
    prefix = cache.insert(key, slots)
    cache.allocator.free(slots[:prefix])


def engine_match(cache: RadixCache, tokens: Sequence[int]) -> int:
    """The engine's own cached-prefix length for tokens."""
    return len(cache.match_prefix(list(tokens)).indices)


class Replica:
    """A RadixCache whose events go out through the engine's publisher, one batch per flush;
    `serve()` answers replay requests the way the scheduler loop does."""

    def __init__(  # noqa: PLR0913
        self, port: int, page_size: int = 1, pool: int = 4096, host: str = "127.0.0.1", **publisher
    ) -> None:
        self.cache = make_cache(page_size, pool)
        self.pub = ZmqKVEventPublisher(host, port, **publisher)
        # A scenario that fails before close() leaves the publisher to the garbage collector,
        # and pyzmq's Context.__del__ then waits in term() forever for sockets it did not
        # close (it hung a whole fresh-clone run after one failed test): close it then.
        self._close_publisher = weakref.finalize(self, self.pub.close)
        self.kv = KVEndpoint(0, self.pub.endpoint, self.pub.replay_endpoint)
        self._server: asyncio.Task[None] | None = None

    @property
    def port(self) -> int:
        """Its PUB port (replays are answered on the next one)."""
        return self.pub.port

    @property
    def last_seq(self) -> int:
        return self.pub.next_seq - 1

    def insert(self, tokens: Sequence[int]) -> None:
        cache_insert(self.cache, tokens)
        self.flush()

    def flush(self) -> None:
        events = self.cache.take_events()
        if events:
            self.pub.publish(events)

    def serve(self) -> None:
        self._server = asyncio.get_running_loop().create_task(self._serve())

    async def _serve(self) -> None:
        while True:
            self.pub.serve_replay(0)
            await asyncio.sleep(0.002)

    async def close(self) -> None:
        if self._server is not None:
            self._server.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._server
        self._close_publisher()  # once: a second call does nothing


def fresh_replica(
    page_size: int = 1, pool: int = 4096, host: str = "127.0.0.1", **publisher: Any
) -> Replica:
    """A Replica on two fresh ports, chosen again if another process binds one first."""
    return bind_retrying(lambda port: Replica(port, page_size, pool, host, **publisher), 2)


Poke = Callable[[], None] | None


async def until(cond: Callable[[], bool], what: str, poke: Poke = None) -> None:
    """Wait for cond; `poke` publishes another batch now and then (a subscriber only acts on
    what it receives, and a batch sent before it joined is not received)."""
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    next_poke = time.monotonic() + 0.2
    while not cond():
        assert time.monotonic() < deadline, f"timed out: {what}"
        if poke is not None and time.monotonic() > next_poke:
            poke()
            next_poke = time.monotonic() + 0.2
        await asyncio.sleep(0.01)
