"""Helpers for tests with real prefill / decode servers: start a pair, send one request to both
sides at once as a PD router does, and read a server's PD counters."""

from __future__ import annotations

import random
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import httpx

from tests.engine.server.live_server import LiveServer, live_server, started_together
from tests.ports import free_port

COMMON = ("--dtype", "float32", "--max-total-tokens", "8192", "--chunked-prefill-size", "64")
# SmolLM2-135M in float32: K and V, 30 layers, 3 KV heads of 64 → bytes of one token's KV
BYTES_PER_TOKEN = 2 * 30 * 3 * 64 * 4


@dataclass(frozen=True)
class Pair:
    prefill: LiveServer
    decode: LiveServer
    bootstrap_port: int


@contextmanager
def pd_pair(
    prefill_args: tuple[str, ...] = (),
    decode_args: tuple[str, ...] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Pair]:
    port = free_port()
    prefill = ("--disaggregation-mode", "prefill", "--disaggregation-bootstrap-port", str(port))
    decode = ("--disaggregation-mode", "decode")
    with started_together(
        lambda: live_server(*COMMON, *prefill, *prefill_args, env=env),
        lambda: live_server(*COMMON, *decode, *decode_args, env=env),
    ) as (p, d):
        yield Pair(p, d, port)


def new_room() -> int:
    return random.randrange(2**63)  # as the routers pick them


def bootstrap_fields(pair: Pair, room: int | None = None) -> dict[str, Any]:
    return {
        "bootstrap_host": "127.0.0.1",
        "bootstrap_port": pair.bootstrap_port,
        "bootstrap_room": new_room() if room is None else room,
    }


def send_both(
    pair: Pair, path: str, body: dict[str, Any], timeout_s: float = 300
) -> tuple[httpx.Response, httpx.Response]:
    """POST the same body (with fresh bootstrap fields) to both sides at once."""
    body = {**body, **bootstrap_fields(pair)}
    with ThreadPoolExecutor(2) as pool:
        p = pool.submit(httpx.post, pair.prefill.base_url + path, json=body, timeout=timeout_s)
        d = pool.submit(httpx.post, pair.decode.base_url + path, json=body, timeout=timeout_s)
        return p.result(), d.result()


def load(server: LiveServer) -> dict[str, Any]:
    r = httpx.get(server.base_url + "/get_load", timeout=30)
    r.raise_for_status()
    out: dict[str, Any] = r.json()
    return out


QUEUES = (
    "num_prefill_bootstrap_queue_reqs",
    "num_prefill_inflight_queue_reqs",
    "num_decode_prealloc_queue_reqs",
    "num_decode_transfer_queue_reqs",
    "num_reqs",
)


def at_rest(server: LiveServer) -> bool:
    """Nothing queued, running or held anywhere: every KV slot free or evictable cache."""
    now = load(server)
    return all(now[q] == 0 for q in QUEUES) and now["num_used_tokens"] == 0
