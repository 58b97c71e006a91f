"""KV events of a live server: a subscriber rebuilds the cached-page set from the PUB stream
(gap → replay, as a router does) and it equals the scheduler's own view; a late subscriber
rebuilds the same set by replay from seq 0; /flush_cache clears it."""

from __future__ import annotations

import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest
import zmq

from radixserve.protocol import AllBlocksCleared, BlockRemoved, BlockStored
from radixserve.protocol.block_hash import block_hashes
from radixserve.protocol.kv_events import KVEventBatch, decode_batch, seq_from_bytes, seq_to_bytes
from tests.engine.server.live_server import LiveServer, live_server

POOL = 4096
SYNC_TIMEOUT_S = 20


class Mirror:
    """A router-style mirror of one replica: the set of cached page hashes."""

    def __init__(self, ctx: zmq.Context, endpoint: str, replay_endpoint: str) -> None:
        self.ctx, self.replay_endpoint = ctx, replay_endpoint
        self.sub = ctx.socket(zmq.SUB)
        self.sub.setsockopt(zmq.SUBSCRIBE, b"")
        self.sub.setsockopt(zmq.LINGER, 0)
        self.sub.connect(endpoint)
        self.pages: set[int] = set()
        self.last_seq = -1
        self.replays = 0
        self.via_stream = 0
        self.counts = {"BlockStored": 0, "BlockRemoved": 0, "AllBlocksCleared": 0}
        self.batches: list[KVEventBatch] = []

    def apply(self, seq: int, payload: bytes) -> None:
        assert seq == self.last_seq + 1, f"seq {seq} after {self.last_seq}"
        batch = decode_batch(payload)
        assert batch.attn_dp_rank == 0
        for ev in batch.events:
            self.counts[type(ev).__name__] += 1
            if isinstance(ev, BlockStored):
                assert len(ev.block_hashes) == 1 and ev.block_size == len(ev.token_ids) == 1
                assert ev.parent_block_hash is None or ev.parent_block_hash in self.pages
                assert ev.block_hashes[0] not in self.pages
                self.pages.update(ev.block_hashes)
            elif isinstance(ev, BlockRemoved):
                assert set(ev.block_hashes) <= self.pages, "removal of an unknown page"
                self.pages.difference_update(ev.block_hashes)
            else:
                assert isinstance(ev, AllBlocksCleared)
                self.pages.clear()
        self.batches.append(batch)
        self.last_seq = seq

    def replay(self, start: int) -> None:
        self.replays += 1
        client = self.ctx.socket(zmq.DEALER)
        client.setsockopt(zmq.LINGER, 0)
        client.connect(self.replay_endpoint)
        client.send_multipart([b"", seq_to_bytes(start)])
        try:
            while True:
                assert client.poll(SYNC_TIMEOUT_S * 1000), "replay timed out"
                empty, seq_b, payload = client.recv_multipart()
                seq = seq_from_bytes(seq_b)
                if seq == -1:
                    return
                if seq > self.last_seq:
                    self.apply(seq, payload)
        finally:
            client.close()

    def pump(self, wait_ms: int = 0) -> None:
        """Apply what the stream delivered; a gap triggers a replay from the missing seq."""
        while self.sub.poll(wait_ms):
            wait_ms = 0
            _topic, seq_b, payload = self.sub.recv_multipart()
            seq = seq_from_bytes(seq_b)
            if seq <= self.last_seq:
                continue
            if seq > self.last_seq + 1:
                self.replay(self.last_seq + 1)
            if seq == self.last_seq + 1:
                self.apply(seq, payload)
                self.via_stream += 1

    def close(self) -> None:
        self.sub.close()


def server_pages(server: LiveServer) -> list[int]:
    r = httpx.get(server.base_url + "/debug/cache_pages", timeout=30)
    r.raise_for_status()
    return r.json()["page_hashes"]


def wait_in_sync(server: LiveServer, mirror: Mirror) -> list[int]:
    """Events may lag the cache by a scheduling round: poll until the views agree."""
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while True:
        mirror.pump(200)
        pages = server_pages(server)
        if sorted(mirror.pages) == pages:
            return pages
        assert time.monotonic() < deadline, (
            f"mirror {len(mirror.pages)} pages vs server {len(pages)} "
            f"(sym. diff {len(mirror.pages ^ set(pages))}, last seq {mirror.last_seq})"
        )


def generate(server: LiveServer, ids: list[int]) -> dict:
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "temperature": 0}}
    r = httpx.post(server.base_url + "/generate", json=body, timeout=300)
    r.raise_for_status()
    return r.json()


def join_stream(server: LiveServer, mirror: Mirror) -> None:
    """Send small distinct requests until the SUB socket sees a batch (it has joined); the
    first batch's gap from -1 makes the mirror replay the history from seq 0."""
    for i in range(50):
        generate(server, [7000 + i, 7100 + i, 7200 + i])
        mirror.pump(1000)
        if mirror.via_stream:
            return
    raise AssertionError("the PUB stream delivered nothing")


@pytest.fixture(scope="module")
def kv_server() -> Iterator[tuple[LiveServer, int]]:
    with live_server("--max-total-tokens", str(POOL), kv_ports=2) as srv:
        assert srv.kv_port is not None
        yield srv, srv.kv_port


@pytest.fixture
def ctx() -> Iterator[zmq.Context]:
    c = zmq.Context()
    yield c
    c.destroy(linger=0)


def endpoints(server: LiveServer) -> dict:
    info = httpx.get(server.base_url + "/server_info", timeout=10).json()
    (ep,) = info["kv_events"]
    return ep


def test_server_info_lists_kv_event_endpoints(kv_server: tuple[LiveServer, int]) -> None:
    server, port = kv_server
    assert endpoints(server) == {
        "dp_rank": 0,
        "endpoint": f"tcp://127.0.0.1:{port}",
        "replay_endpoint": f"tcp://127.0.0.1:{port + 1}",
        "topic": "",
    }


def test_stream_mirror_matches_server_through_evictions_and_late_replay(
    kv_server: tuple[LiveServer, int], ctx: zmq.Context
) -> None:
    server, _ = kv_server
    ep = endpoints(server)
    mirror = Mirror(ctx, ep["endpoint"], ep["replay_endpoint"])
    join_stream(server, mirror)
    assert mirror.replays == 1  # the history before joining, from seq 0
    assert mirror.batches[0].events[0] == AllBlocksCleared()  # the start-up reset comes first

    # Shared prefixes: one long stem, several branches, some concurrent.
    stem = list(range(1000, 1200))
    branches = [stem + [5000 + 10 * i + j for j in range(30)] for i in range(6)]
    generate(server, branches[0])
    with ThreadPoolExecutor(4) as pool:
        outs = list(pool.map(lambda ids: generate(server, ids), branches[1:]))
    assert all(o["meta_info"]["cached_tokens"] >= len(stem) for o in outs)
    pages = wait_in_sync(server, mirror)
    assert set(block_hashes(branches[-1], 1)) <= set(pages)  # same hash scheme as the router

    # Distinct traffic well beyond the 4096-token pool forces evictions.
    distinct = [[20000 + 600 * i + j for j in range(600)] for i in range(12)]
    with ThreadPoolExecutor(3) as pool:
        list(pool.map(lambda ids: generate(server, ids), distinct))
    pages = wait_in_sync(server, mirror)
    assert mirror.counts["BlockRemoved"] > 0, "no eviction happened"
    assert len(pages) <= POOL
    assert set(block_hashes(distinct[-1], 1)) <= set(pages)  # the newest survived
    assert mirror.replays == 1, "the stream dropped batches"

    # A late subscriber rebuilds the same set by replay from seq 0.
    late = Mirror(ctx, ep["endpoint"], ep["replay_endpoint"])
    late.replay(0)
    assert late.last_seq == mirror.last_seq
    assert late.pages == mirror.pages == set(pages)
    assert late.counts == mirror.counts
    late.close()
    mirror.close()


def test_flush_cache_publishes_all_blocks_cleared(
    kv_server: tuple[LiveServer, int], ctx: zmq.Context
) -> None:
    server, _ = kv_server
    ep = endpoints(server)
    mirror = Mirror(ctx, ep["endpoint"], ep["replay_endpoint"])
    join_stream(server, mirror)
    generate(server, list(range(3000, 3100)))
    assert len(wait_in_sync(server, mirror)) > 0
    cleared = mirror.counts["AllBlocksCleared"]
    r = httpx.post(server.base_url + "/flush_cache", timeout=30)
    assert r.status_code == 200 and r.json()["success"]
    deadline = time.monotonic() + SYNC_TIMEOUT_S
    while mirror.counts["AllBlocksCleared"] == cleared:
        assert time.monotonic() < deadline, "no AllBlocksCleared after /flush_cache"
        mirror.pump(200)
    assert mirror.pages == set()
    assert wait_in_sync(server, mirror) == []
    # After the flush the mirror follows new traffic again.
    generate(server, list(range(3000, 3050)))
    assert len(wait_in_sync(server, mirror)) > 0
    mirror.close()
