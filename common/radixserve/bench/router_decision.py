"""The cost of one routing decision with large mirrors, measured through the real path.

T targets each get a stream of KV events (SGLang's wire format on a ZMQ PUB socket, one
BlockStored per page, chained by parent hash like an engine emits them) describing
`cached_tokens` tokens: documents of a shared group prefix plus a unique tail. The router's
CacheIndex subscribes to them as it would to live replicas; then its Selector (views + prefix
match on every target + cache_aware policy) is timed on prompts that hit, partly hit, or miss.
"""

from __future__ import annotations

import asyncio
import random
import statistics
import time
from typing import Any

import httpx
import zmq
import zmq.asyncio

from radixserve.protocol.block_hash import block_hashes
from radixserve.protocol.kv_events import (
    AllBlocksCleared,
    BlockStored,
    KVEventBatch,
    encode_batch,
    seq_to_bytes,
)
from radixserve.router.addresses import KVEndpoint
from radixserve.router.config import RouterConfig
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.policies import make_policy
from radixserve.router.selector import Selector
from radixserve.router.workers import WorkerRegistry

GROUP_PREFIX = 500
DOC_TAIL = 500
EVENTS_PER_BATCH = 512
NUM_QUERIES = 2000


def documents(total: int, rng: random.Random, vocab: int = 49152) -> list[list[int]]:
    """Docs of a shared 500-token group prefix + a unique 500-token tail, `total` tokens."""
    groups = [[rng.randrange(100, vocab) for _ in range(GROUP_PREFIX)] for _ in range(10)]
    docs: list[list[int]] = []
    cached = 0
    while cached < total:
        group = groups[len(docs) % len(groups)]
        docs.append(group + [rng.randrange(100, vocab) for _ in range(DOC_TAIL)])
        cached += DOC_TAIL + (GROUP_PREFIX if len(docs) <= len(groups) else 0)
    return docs


def store_events(docs: list[list[int]], page_size: int) -> list[BlockStored]:
    """One BlockStored per new page, as an engine's radix tree reports its inserts."""
    seen: set[int] = set()
    events = []
    for doc in docs:
        hashes = block_hashes(doc, page_size)
        for i, h in enumerate(hashes):
            if h in seen:
                continue
            seen.add(h)
            page = doc[i * page_size : (i + 1) * page_size]
            events.append(BlockStored([h], hashes[i - 1] if i else None, page, page_size))
    return events


def _publish(sock: zmq.Socket[bytes], events: list[Any]) -> None:
    batches = [[AllBlocksCleared()]] + [
        events[i : i + EVENTS_PER_BATCH] for i in range(0, len(events), EVENTS_PER_BATCH)
    ]
    for seq, batch in enumerate(batches):
        payload = encode_batch(KVEventBatch(time.time(), batch))
        sock.send_multipart([b"", seq_to_bytes(seq), payload])


async def _fill(
    index: CacheIndex, registry: WorkerRegistry, docs_per_target: list[list[list[int]]], page: int
) -> None:
    ctx = zmq.Context()
    socks = []
    try:
        for t in range(len(docs_per_target)):
            sock = ctx.socket(zmq.PUB)
            sock.setsockopt(zmq.SNDHWM, 0)
            port = sock.bind_to_random_port("tcp://127.0.0.1")
            socks.append(sock)
            worker = registry.add(f"http://127.0.0.1:{20000 + t}", source="bench")
            worker.healthy = worker.ever_healthy = True
            index.add_rank((worker.url, 0), page, KVEndpoint(0, f"tcp://127.0.0.1:{port}"))
        await index.start()
        await asyncio.sleep(1.0)  # SUB sockets connect (a PUB drops what nobody receives yet)
        for sock, docs in zip(socks, docs_per_target, strict=True):
            _publish(sock, store_events(docs, page))
        await _wait_filled(index, len(docs_per_target))
    finally:
        for sock in socks:
            sock.close(linger=1000)
        ctx.term()


async def _wait_filled(index: CacheIndex, n: int, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    last: list[int] = []
    while time.monotonic() < deadline:
        sizes = [s.num_tokens for s in index.stats().values()]
        if len(sizes) == n and sizes == last and min(sizes) > 0:
            return
        last = sizes
        await asyncio.sleep(0.5)
    raise RuntimeError(f"mirrors did not fill: {last}")


def _queries(docs: list[list[int]], prompt_len: int, rng: random.Random) -> list[list[int]]:
    """A third full hits (a cached doc + a new question), a third group-prefix hits, a third
    misses; each `prompt_len` tokens."""
    out = []
    for i in range(NUM_QUERIES):
        doc = rng.choice(docs)
        head = doc if i % 3 == 0 else doc[:GROUP_PREFIX] if i % 3 == 1 else []
        head = head[:prompt_len]
        out.append(head + [rng.randrange(100, 49152) for _ in range(prompt_len - len(head))])
    return out


async def _measure(
    targets: int, cached: int, prompt_len: int, page: int, rng: random.Random
) -> dict[str, Any]:
    config = RouterConfig()
    async with httpx.AsyncClient() as client:
        index = CacheIndex()
        registry = WorkerRegistry(config, client, index)
        docs = [documents(cached, rng) for _ in range(targets)]
        await _fill(index, registry, docs, page)
        selector = Selector(registry, index, make_policy(config))
        times = []
        hits = 0
        for q in _queries(docs[0], prompt_len, rng):
            lease = selector.choose(q)
            assert lease is not None
            times.append(lease.decision_s)
            hits += lease.cached_tokens > 0
            lease.release()
        sizes = [s.num_tokens for s in index.stats().values()]
        await index.aclose()
    times_us = sorted(t * 1e6 for t in times)
    return {
        "targets": targets,
        "cached_tokens_per_target": min(sizes),
        "prompt_len": prompt_len,
        "page_size": page,
        "decisions": len(times_us),
        "with_cache_hit": hits,
        "p50_us": statistics.median(times_us),
        "p99_us": times_us[int(0.99 * len(times_us))],
        "mean_us": statistics.fmean(times_us),
    }


def measure_decision(
    targets: int, cached_tokens: int, prompt_len: int, page_size: int, rng: random.Random
) -> dict[str, Any]:
    return asyncio.run(_measure(targets, cached_tokens, prompt_len, page_size, rng))
