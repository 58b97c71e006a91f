"""A real prefill server and a real decode server (separate processes, the KV moved by Mooncake's
TransferEngine over TCP) against a co-located server: the same greedy outputs, the prefill's
cache reused, the bytes moved counted on both sides, aborts in every queue, a topology
mismatch refused on both sides."""

from __future__ import annotations

import json
import socket
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import httpx
import openai
import pytest

from tests.conftest import PROMPTS
from tests.engine.disaggregation.pd_servers import (
    BYTES_PER_TOKEN,
    COMMON,
    Pair,
    at_rest,
    bootstrap_fields,
    load,
    send_both,
)
from tests.engine.server.live_server import LiveServer, live_server
from tests.ports import free_port

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a careful assistant. Answer in one short sentence, plainly, without lists, and "
    "say so when you do not know. The user is a student preparing for an exam in geography, "
    "history and elementary science, and wants facts, not opinions. "
)
QUESTIONS = [
    "What is the capital of Italy?",
    "Which ocean is the largest?",
    "Who wrote Hamlet?",
    "What gas do plants breathe in?",
    "How many continents are there?",
    "What is the boiling point of water?",
    "Which planet is called the red planet?",
    "What is the longest river in Africa?",
]
# 16 prompts: 8 short ones, 8 sharing a long prefix (chunked at 64 tokens, then cache hits)
BATCH = PROMPTS + [SYSTEM + q for q in QUESTIONS]
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}


# Shared with tests/router/test_router_pd.py (shared_pd.py): no test here leaves them changed.
# The pair's decode releases an aborted room's pages after 4 s, not 30 (shared_pd.PAIR_ENV),
# so the abort test's "at rest" comes sooner; no test here writes late.
@pytest.fixture(scope="module")
def colocated(pd_shared_colocated: LiveServer) -> LiveServer:
    return pd_shared_colocated


@pytest.fixture(scope="module")
def pair(pd_shared_pair: Pair) -> Pair:
    return pd_shared_pair


def _generate(url: str, text: str, extra: dict[str, Any] | None = None) -> httpx.Response:
    body = {"text": text, "sampling_params": GREEDY, **(extra or {})}
    return httpx.post(url + "/generate", json=body, timeout=300)


def _wait(predicate: Any, what: str, limit_s: float = 120) -> None:
    """Poll until `predicate()`; the limit turns a hang into a failure (no timing asserted)."""
    deadline = time.monotonic() + limit_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached: {what}")
        time.sleep(0.5)


def _pd_round(pair: Pair) -> list[tuple[httpx.Response, httpx.Response]]:
    with ThreadPoolExecutor(8) as pool:
        body = lambda text: {"text": text, "sampling_params": GREEDY}  # noqa: E731
        return list(pool.map(lambda t: send_both(pair, "/generate", body(t)), BATCH))


def test_same_greedy_outputs_as_colocated_and_bytes_counted_on_both_sides(
    colocated: LiveServer, pair: Pair
) -> None:
    with ThreadPoolExecutor(8) as pool:
        expected = list(pool.map(lambda t: _generate(colocated.base_url, t), BATCH))
    want = [r.json()["output_ids"] for r in expected]
    before_p, before_d = load(pair.prefill), load(pair.decode)
    first = _pd_round(pair)
    assert [p.status_code for p, _ in first] == [200] * len(BATCH)
    assert [d.json()["output_ids"] for _, d in first] == want
    assert all(len(p.json()["output_ids"]) == 1 for p, _ in first)  # the prefill's one token
    # The decode keeps no radix cache: every prompt page moved, and both sides count it.
    prompt_tokens = sum(d.json()["meta_info"]["prompt_tokens"] for _, d in first)
    after_p, after_d = load(pair.prefill), load(pair.decode)
    moved_p = after_p["kv_transfer_bytes_total"] - before_p["kv_transfer_bytes_total"]
    moved_d = after_d["kv_transfer_bytes_total"] - before_d["kv_transfer_bytes_total"]
    assert moved_p == moved_d == prompt_tokens * BYTES_PER_TOKEN
    # A second round: the prefill serves every prompt from its radix cache, same outputs.
    second = _pd_round(pair)
    assert [d.json()["output_ids"] for _, d in second] == want
    cached = [d.json()["meta_info"]["cached_tokens"] for _, d in second]
    assert all(c > 0 for c in cached) and cached == [
        p.json()["meta_info"]["cached_tokens"] for p, _ in second
    ]
    _wait(lambda: at_rest(pair.prefill) and at_rest(pair.decode), "both sides at rest")


def test_openai_chat_stream_through_the_pair(colocated: LiveServer, pair: Pair) -> None:
    messages = [{"role": "user", "content": "Name three colors of the rainbow."}]
    params: dict[str, Any] = {"model": "smollm2-135m", "messages": messages, "max_tokens": 20}
    params["temperature"] = 0
    want = openai.OpenAI(base_url=colocated.base_url + "/v1", api_key="x")
    expected = want.chat.completions.create(**params).choices[0].message.content
    fields = bootstrap_fields(pair)
    with ThreadPoolExecutor(1) as pool:
        prefill = pool.submit(
            httpx.post,
            pair.prefill.base_url + "/v1/chat/completions",
            json={**params, **fields},
            timeout=300,
        )
        client = openai.OpenAI(base_url=pair.decode.base_url + "/v1", api_key="x")
        stream = client.chat.completions.create(**params, stream=True, extra_body=fields)
        text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        assert prefill.result().status_code == 200
    assert text == expected


def _abandon(url: str, body: dict[str, Any], queue: tuple[LiveServer, str]) -> None:
    """Send a request, wait until the server counts one request in `queue`, then hang up
    (the server sees a client disconnect with the request parked there)."""
    server, name = queue
    payload = json.dumps(body).encode()
    head = "POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    address = httpx.URL(url)
    with socket.create_connection((address.host, address.port or 80), timeout=30) as s:
        s.sendall(f"{head}Content-Length: {len(payload)}\r\n\r\n".encode() + payload)
        _wait(lambda: load(server)[name] == 1, f"one request in {name}")


def test_abort_in_every_queue_leaves_both_sides_at_rest(pair: Pair) -> None:
    body = {"text": "An abandoned request", "sampling_params": GREEDY}
    # prefill bootstrap queue: no decode ever asks for the room
    bootstrap = (pair.prefill, "num_prefill_bootstrap_queue_reqs")
    _abandon(pair.prefill.base_url, {**body, **bootstrap_fields(pair)}, bootstrap)
    # decode pre-allocation queue: its prefill's bootstrap server does not answer
    nowhere = {**bootstrap_fields(pair), "bootstrap_port": free_port()}
    _abandon(
        pair.decode.base_url, {**body, **nowhere}, (pair.decode, "num_decode_prealloc_queue_reqs")
    )
    # decode transfer queue: the prefill has the KVRequest but never gets the request
    transfer = (pair.decode, "num_decode_transfer_queue_reqs")
    _abandon(pair.decode.base_url, {**body, **bootstrap_fields(pair)}, transfer)
    _wait(lambda: at_rest(pair.prefill) and at_rest(pair.decode), "both sides at rest")
    # and the pair still serves
    p, d = send_both(pair, "/generate", body)
    assert (p.status_code, d.status_code) == (200, 200)


def test_topology_mismatch_is_refused_on_both_sides(pair: Pair) -> None:
    with live_server(*COMMON, "--disaggregation-mode", "decode", "--page-size", "16") as odd:
        other = Pair(pair.prefill, odd, pair.bootstrap_port)
        p, d = send_both(other, "/generate", {"text": "Hello", "sampling_params": GREEDY})
        for r in (p, d):
            assert r.status_code == 500
            message = r.json()["message"]
            assert "topology mismatch (page_size)" in message
            assert "page_size=1" in message and "page_size=16" in message
        assert load(odd)["bootstrap_failed_total"] == 1
        _wait(lambda: at_rest(pair.prefill) and at_rest(odd), "both sides at rest")


def test_metrics_show_the_queues_and_transfers(pair: Pair) -> None:
    from prometheus_client.parser import text_string_to_metric_families

    p, d = send_both(pair, "/generate", {"text": "Metrics, please", "sampling_params": GREEDY})
    assert (p.status_code, d.status_code) == (200, 200)
    for server in (pair.prefill, pair.decode):
        text = httpx.get(server.base_url + "/metrics", timeout=30).text
        samples = {s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples}
        now = load(server)
        assert samples["radixserve:kv_transfer_bytes_total"] == now["kv_transfer_bytes_total"] > 0
        assert samples["radixserve:kv_transfers_total"] == now["kv_transfers_total"] >= 1
        assert samples["radixserve:num_decode_transfer_queue_reqs"] == 0
        assert samples["radixserve:num_prefill_bootstrap_queue_reqs"] == 0
