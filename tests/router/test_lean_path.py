"""The proxied routes' lean path (router/edge.py) answers as the reference path does: FastAPI's
own routes behind the app's whole middleware stack, which is what `FastAPI.__call__` runs.

- At the edge, on the real app (no worker needed: each answer comes before any forwarding, or
  is the 503 of no worker): missing and wrong keys, bodies over the limit by Content-Length
  (before the key) and by a chunked upload, malformed and non-finite JSON, no worker. Both
  paths give the same status, body and headers, request id included.
- Through a real router process in front of a worker double (an HTTP server that answers
  SGLang's discovery routes and echoes the headers a chat request reached it with): the
  client's X-Request-ID, or the fresh one the router made, is the one the worker got and the
  one the answer carries, plain and streamed; a client that leaves a stream makes the router
  leave the worker's stream too (what makes an engine abort the request).
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn
from fastapi import FastAPI, Request, Response
from fastapi.responses import JSONResponse, StreamingResponse

from radixserve.router.app import create_app
from radixserve.router.config import RouterConfig
from tests.ports import bind_retrying, listening_socket
from tests.router.router_proc import router_proc

KEY = "k3y"
LIMIT = 4096
GOOD = b'{"text": "hi", "sampling_params": {"max_new_tokens": 1}}'
CASES: list[tuple[str, dict[str, str], Any]] = [
    ("/generate", {}, GOOD),  # no key
    ("/generate", {"authorization": "Bearer nope"}, GOOD),
    ("/v1/completions", {"content-length": str(LIMIT + 1)}, b"x" * (LIMIT + 1)),  # before the key
    ("/generate", {"authorization": f"Bearer {KEY}"}, b"x" * (LIMIT + 1)),
    ("/generate", {"authorization": f"Bearer {KEY}"}, "chunked"),
    ("/v1/chat/completions", {"authorization": f"Bearer {KEY}"}, b"{not json"),
    ("/generate", {"authorization": f"Bearer {KEY}"}, b"[1, 2]"),
    ("/generate", {"authorization": f"Bearer {KEY}"}, b'{"temperature": NaN}'),
    ("/v1/completions", {"authorization": f"Bearer {KEY}", "x-request-id": "r-1"}, GOOD),
    ("/generate", {"authorization": f"Bearer {KEY}"}, GOOD),  # no worker: the 503
]


def _content(body: Any) -> Any:
    if body != "chunked":
        return body

    async def pieces() -> AsyncIterator[bytes]:  # no Content-Length: counted as it arrives
        for _ in range(LIMIT // 1000 + 2):
            yield b"y" * 1000

    return pieces()


def _ask(app: Any) -> list[httpx.Response]:
    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            return [
                await client.post(path, headers=headers, content=_content(body))
                for path, headers, body in CASES
            ]

    return asyncio.run(scenario())


def _comparable(resp: httpx.Response) -> tuple[Any, ...]:
    body = resp.json()
    rid = resp.headers["x-request-id"]
    if "request_id" in body:
        body["request_id"] = "…" if body["request_id"] == rid else body["request_id"]
    headers = [(k, "…" if k == "x-request-id" else v) for k, v in resp.headers.items()]
    return resp.status_code, body, headers, rid == "r-1" or len(rid) == 32


def test_the_lean_path_answers_as_the_middleware_stack_does() -> None:
    config = RouterConfig(api_key=KEY, max_request_body_bytes=LIMIT)
    app = create_app(config)
    reference = create_app(config)

    async def through_the_stack(scope: Any, receive: Any, send: Any) -> None:
        await FastAPI.__call__(reference, scope, receive, send)

    lean, ref = _ask(app), _ask(through_the_stack)
    assert [r.status_code for r in lean] == [401, 401, 413, 413, 413, 400, 400, 400, 503, 503]
    for case, a, b in zip(CASES, lean, ref, strict=True):
        assert _comparable(a) == _comparable(b), (case[:2], a.text, b.text)
    assert lean[7].json()["param"] == "temperature" and lean[8].headers["x-request-id"] == "r-1"


# ---- the request id reaches the worker ----------------------------------------------------------


@dataclass
class Double:
    """What the worker double saw: streams it ended because the router left them."""

    abandoned: int = 0


def _worker_double(seen: Double) -> FastAPI:
    """SGLang's discovery routes, and a chat route that answers the headers it got (`slow`:
    a stream of 200 events 50 ms apart, counting in `seen` when the router leaves early)."""
    app = FastAPI()
    info = {"page_size": 1, "dp_size": 1, "served_model_name": "double"}
    app.get("/health")(lambda: Response(status_code=200))
    app.get("/server_info")(lambda: JSONResponse(info))
    app.get("/model_info")(lambda: JSONResponse({"served_model_name": "double"}))
    app.get("/get_load")(lambda: JSONResponse({"dp_rank": 0, "num_reqs": 0}))

    @app.post("/v1/chat/completions")
    async def chat(request: Request) -> Response:
        got = {"headers": dict(request.headers)}
        body = await request.json()
        if body.get("stream"):

            async def events() -> AsyncIterator[bytes]:
                yield f"data: {json.dumps(got)}\n\n".encode()
                for _ in range(200 if body.get("slow") else 0):
                    try:
                        await asyncio.sleep(0.05)
                    except asyncio.CancelledError:
                        seen.abandoned += 1
                        raise
                    yield b"data: {}\n\n"
                yield b"data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream")
        return JSONResponse(got)

    return app


@pytest.fixture
def double() -> Double:
    return Double()


@pytest.fixture
def worker(double: Double) -> Iterator[str]:
    sock = bind_retrying(listening_socket)
    server = uvicorn.Server(uvicorn.Config(_worker_double(double), log_level="warning"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and not server.started:
        time.sleep(0.05)
    yield url
    server.should_exit = True
    thread.join(10)
    sock.close()


def test_the_request_id_reaches_the_worker_and_comes_back(worker: str) -> None:
    chat = {"messages": [{"role": "user", "content": "hi"}]}
    with router_proc([worker], healthy=1) as router:
        url = router.url + "/v1/chat/completions"
        for stream in (False, True):
            fresh = httpx.post(url, json={**chat, "stream": stream}, timeout=30)
            kept = httpx.post(
                url, json={**chat, "stream": stream}, headers={"X-Request-ID": "req-7"}, timeout=30
            )
            for resp, expected in ((fresh, fresh.headers["x-request-id"]), (kept, "req-7")):
                assert resp.status_code == 200, resp.text
                got = json.loads(resp.text.split("\n")[0].removeprefix("data: "))
                assert got["headers"]["x-request-id"] == expected == resp.headers["x-request-id"]
            assert len(fresh.headers["x-request-id"]) == 32


def test_a_client_leaving_a_stream_makes_the_router_leave_the_worker(
    worker: str, double: Double
) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "stream": True, "slow": True}
    with router_proc([worker], healthy=1) as router:
        with httpx.stream("POST", router.url + "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            next(resp.iter_lines())  # the first event, then the client goes
        deadline = time.monotonic() + 5  # the whole stream would take 10 s
        while double.abandoned == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert double.abandoned == 1
        assert "Exception in ASGI application" not in router.log_tail()
