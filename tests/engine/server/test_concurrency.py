"""64 concurrent streams complete; 8 clients that disconnect early get their requests
aborted, and the server returns to idle (no running requests, token usage at rest)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.engine.server.live_server import LiveServer

N_STREAMS = 64
N_DISCONNECT = 8
NEW_TOKENS = 24


async def stream_one(client: httpx.AsyncClient, url: str, i: int, disconnect: bool) -> dict:
    body = {
        "text": f"Request {i}: write a long story about the number {i}.",
        "stream": True,
        "sampling_params": {"max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True},
    }
    last: dict = {}
    async with client.stream("POST", url + "/generate", json=body) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if line.startswith("data: ") and line != "data: [DONE]":
                last = json.loads(line[6:])
                if disconnect and last["meta_info"]["completion_tokens"] >= 2:
                    return {"disconnected": True}  # leaving the context closes the socket
    return last


async def run_all(url: str) -> list[dict]:
    async with httpx.AsyncClient(timeout=600, limits=httpx.Limits(max_connections=None)) as c:
        return await asyncio.gather(
            *(stream_one(c, url, i, i < N_DISCONNECT) for i in range(N_STREAMS))
        )


EXPECTED_METRICS = [
    "num_running_reqs",
    "num_queue_reqs",
    "token_usage",
    "cache_hit_rate",
    "gen_throughput",
    "num_retractions_total",
    "prompt_tokens_total",
    "generation_tokens_total",
    "cached_tokens_total",
    "time_to_first_token_seconds_bucket",
    "inter_token_latency_seconds_bucket",
    "e2e_request_latency_seconds_bucket",
]


def wait_idle(server: LiveServer, timeout_s: float = 60) -> dict:
    deadline = time.monotonic() + timeout_s
    load: dict = {}
    while time.monotonic() < deadline:
        load = httpx.get(server.base_url + "/get_load", timeout=10).json()
        if load["num_reqs"] == 0 and load["token_usage"] == 0:
            return load
        time.sleep(0.5)
    return load


def test_64_concurrent_streams_and_early_disconnects(server: LiveServer) -> None:
    outs = asyncio.run(run_all(server.base_url))
    finished = [o for o in outs if not o.get("disconnected")]
    assert len(finished) == N_STREAMS - N_DISCONNECT
    for o in finished:
        assert o["meta_info"]["finish_reason"] == {"type": "length", "length": NEW_TOKENS}
        assert len(o["output_ids"]) == NEW_TOKENS
    load = wait_idle(server)
    assert load["num_reqs"] == 0, load
    assert load["token_usage"] == 0, load
    metrics = httpx.get(server.base_url + "/metrics", timeout=10).text
    aborted = [
        ln for ln in metrics.splitlines() if ln.startswith("radixserve:num_aborted_requests_total")
    ]
    assert aborted and float(aborted[0].split()[-1]) >= N_DISCONNECT
    for name in EXPECTED_METRICS:
        assert f"radixserve:{name}" in metrics, name
