"""`radixserve serve --tp-size 2 --dp-size 2 --enable-dp-attention --ep-size 2` (all_to_all
dispatch) on a tiny Qwen2-MoE, with `radixserve router` live in front of it — one shared set of
processes (two scheduler ranks in one world, each its own DP rank's attention, radix cache and
scheduler, the MoE layers over both; the detokenizer; the router) for every check:

- `/server_info` reports the layout and one KV-event endpoint per DP rank; `/get_load` one entry
  per rank; `/metrics` load gauges per `dp_rank`.
- Requests pinned with `data_parallel_rank` (the `openai` client's extra_body) are served by that
  rank: its KV events (SUB sockets on both endpoints) arrive tagged with that `dp_rank`.
- Through the router, each tenant's follow-ups reach the DP rank caching its prefix: the
  engine reports the prefix as cached (the radix caches are per rank, so a follow-up landing on
  the other rank would report 0), and the router's mirror of each rank holds as many tokens as
  that rank's own cache.

(`--dp-size` without DP attention runs the same controller, ports and events:
test_dp_generate.py.)"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
import zmq

from radixserve.protocol.kv_events import decode_batch
from tests.engine.models.tiny import VOCAB, save_tiny
from tests.engine.server.live_server import LiveServer, live_server
from tests.router.router_proc import Router, parse_metrics, router_proc, wait_for

MIRROR_TOKENS = "radixserve_router_mirror_tokens"


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LiveServer, Router]]:
    folder = tmp_path_factory.mktemp("qwen2_moe")
    save_tiny("qwen2_moe", folder, seed=5)
    args = (
        "--model-path", str(folder), "--tp-size", "2", "--dp-size", "2", "--ep-size", "2",
        "--enable-dp-attention",
        "--moe-a2a-backend", "all_to_all", "--dtype", "float32", "--max-total-tokens", "4096",
        "--skip-server-warmup",
    )  # fmt: skip
    with (
        live_server(*args, log_dir=str(folder), kv_ports=4) as srv,  # 2 DP ranks
        router_proc([srv.base_url], healthy=1) as router,
    ):
        yield srv, router


def _ids(seed: int, n: int) -> list[int]:
    import random

    rng = random.Random(seed)
    return [rng.randrange(2, VOCAB) for _ in range(n)]


def _get(srv: LiveServer, path: str) -> Any:
    resp = httpx.get(srv.base_url + path, timeout=60)
    resp.raise_for_status()
    return resp.json()


def test_layout_is_reported_per_rank(stack: tuple[LiveServer, Router]) -> None:
    srv, _ = stack
    info = _get(srv, "/server_info")
    assert (info["tp_size"], info["dp_size"], info["ep_size"]) == (2, 2, 2)
    assert info["enable_dp_attention"] is True
    assert [e["dp_rank"] for e in info["kv_events"]] == [0, 1]
    assert [r["dp_rank"] for r in info["dp_ranks"]] == [0, 1]
    assert [load["dp_rank"] for load in _get(srv, "/get_load")] == [0, 1]
    text = httpx.get(srv.base_url + "/metrics", timeout=60).text
    ranks = {
        dict(labels).get("dp_rank")
        for (name, labels) in parse_metrics(text)
        if name == "radixserve:num_running_reqs"
    }
    assert ranks == {"0", "1"}


def _per_rank(srv: LiveServer, sample: str) -> dict[str, float]:
    text = httpx.get(srv.base_url + "/metrics", timeout=60).text
    return {
        dict(labels)["dp_rank"]: value
        for (name, labels), value in parse_metrics(text).items()
        if name == sample
    }


def test_request_metrics_carry_the_serving_rank(stack: tuple[LiveServer, Router]) -> None:
    srv, _ = stack
    names = ("radixserve:num_requests_total", "radixserve:e2e_request_latency_seconds_count")
    before = [_per_rank(srv, name) for name in names]
    for _ in range(2):
        body = {"input_ids": _ids(7, 8), "sampling_params": {"max_new_tokens": 2}}
        resp = httpx.post(srv.base_url + "/generate", json={**body, "data_parallel_rank": 1})
        assert resp.status_code == 200, resp.text
    for name, was in zip(names, before, strict=True):
        now = _per_rank(srv, name)
        assert now["1"] - was.get("1", 0.0) == 2, name
        assert now.get("0", 0.0) == was.get("0", 0.0), name  # rank 0 served none of them


def test_pinned_requests_publish_from_their_rank(stack: tuple[LiveServer, Router]) -> None:
    openai = pytest.importorskip("openai")
    srv, _ = stack
    ctx = zmq.Context()
    subs = []
    for ep in _get(srv, "/server_info")["kv_events"]:
        sub = ctx.socket(zmq.SUB)
        sub.setsockopt(zmq.SUBSCRIBE, b"")
        sub.setsockopt(zmq.LINGER, 0)
        sub.connect(ep["endpoint"])
        subs.append(sub)
    client = openai.OpenAI(base_url=srv.base_url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    seen: dict[int, set[int | None]] = {0: set(), 1: set()}
    try:
        deadline = time.monotonic() + 60
        while not all(seen[r] for r in (0, 1)):  # a SUB joins late: retry with fresh prompts
            assert time.monotonic() < deadline, f"KV events seen per endpoint: {seen}"
            for rank in (0, 1):
                out = client.completions.create(
                    model=model,
                    prompt=_ids(int(time.monotonic() * 1000) + rank, 12),
                    max_tokens=2,
                    temperature=0,
                    extra_body={"data_parallel_rank": rank},
                )
                assert out.choices[0].text is not None
            for rank, sub in enumerate(subs):
                while sub.poll(500):
                    _topic, _seq, payload = sub.recv_multipart()
                    seen[rank].add(decode_batch(payload).attn_dp_rank)
    finally:
        for sub in subs:
            sub.close()
        ctx.term()
    assert seen == {0: {0}, 1: {1}}  # each endpoint carries only its own rank's batches


def test_router_routes_follow_ups_to_the_caching_rank(stack: tuple[LiveServer, Router]) -> None:
    openai = pytest.importorskip("openai")
    srv, router = stack
    client = openai.OpenAI(base_url=router.url + "/v1", api_key="none")
    model = client.models.list().data[0].id
    prefix_len = 48
    for tenant in range(4):
        prefix = _ids(1000 + tenant, prefix_len)
        first = client.completions.create(
            model=model, prompt=prefix + _ids(2000 + tenant, 4), max_tokens=2, temperature=0
        )
        assert first.usage is not None
        wait_for(lambda: _mirrors_match(srv, router), 30, "the router's per-rank mirrors")
        for turn in range(2):
            follow = client.completions.create(
                model=model,
                prompt=prefix + _ids(3000 + 10 * tenant + turn, 6),
                max_tokens=2,
                temperature=0,
            )
            assert follow.usage is not None and follow.usage.prompt_tokens_details is not None
            assert follow.usage.prompt_tokens_details.cached_tokens >= prefix_len, (tenant, turn)
    wait_for(lambda: _mirrors_match(srv, router), 30, "the router's per-rank mirrors")


def _mirrors_match(srv: LiveServer, router: Router) -> bool:
    """The router's mirror of (engine, rank) holds as many tokens as that rank's cache."""
    mirrors = {
        dict(labels).get("dp_rank"): value
        for (name, labels), value in router.metrics().items()
        if name == MIRROR_TOKENS
    }
    pages = _get(srv, "/debug/cache_pages")["dp_ranks"]
    engine = {str(r["dp_rank"]): float(len(r["page_hashes"])) for r in pages}
    return mirrors == engine
