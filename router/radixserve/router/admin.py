"""The admin API, behind `Authorization: Bearer <admin key>`: `GET/POST/DELETE /workers` and
`POST /flush_cache` (every healthy worker flushes its radix cache).

POST registers a worker only after it answered (`/server_info`, or vLLM's endpoints;
the URL may name the engine API as on the command line, `vllm+http://host:port`; an
unreachable URL is a 400, not a silent pending entry); DELETE drops it and its mirrors. A
flush empties the mirrors too, through the workers' AllBlocksCleared events. Without
`--admin-key` the API is closed: every call is a 401 that says how to open it.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixserve.protocol.http_edge import bearer_matches, error_response, read_json_body
from radixserve.router.addresses import KVEndpoint, normalize_url
from radixserve.router.engine_api import split_engine_api


def _denied(request: Request) -> Response | None:
    key = request.app.state.router.config.admin_key
    if key is None:
        return error_response("admin API is closed: start the router with --admin-key", 401)
    given = request.headers.get("authorization", "").encode("latin-1")
    if not bearer_matches(given, key):
        return error_response("invalid or missing admin key", 401)
    return None


def _kv_events(raw: Any) -> tuple[KVEndpoint, ...] | None:
    """`kv_events`: where to follow the worker's KV events when its own answer is not
    reachable from the router (NAT, a relay): `[{"endpoint", "replay_endpoint"?, "dp_rank"?,
    "topic"?}]`, as /server_info lists them. None (absent): ask the worker."""
    if raw is None:
        return None
    if not isinstance(raw, list) or not all(
        isinstance(e, dict) and isinstance(e.get("endpoint"), str) for e in raw
    ):
        raise ValueError("kv_events: expected a list of {endpoint, replay_endpoint, dp_rank}")
    try:
        return tuple(
            KVEndpoint(int(e.get("dp_rank", 0)), e["endpoint"], e.get("replay_endpoint"),
                       str(e.get("topic", "")))
            for e in raw
        )  # fmt: skip
    except (TypeError, ValueError):
        raise ValueError("kv_events: dp_rank must be an integer") from None


async def _add_worker(request: Request) -> Response:
    state = request.app.state.router
    body = await read_json_body(request)
    if isinstance(body, Response):
        return body
    if not isinstance(body.get("url"), str):
        return error_response("url: expected a string such as http://host:port", 400)
    try:
        kv = _kv_events(body.get("kv_events"))
        # As on the command line: `vllm+http://h:p` / `sglang+http://h:p` name the engine API.
        worker = state.registry.add(
            body["url"], body.get("api_key"), source="admin", kv_override=kv
        )
    except ValueError as exc:
        return error_response(str(exc), 400)
    url = worker.url
    try:
        await state.registry.probe(worker)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        await state.registry.remove(url)
        return error_response(f"url: worker {url} is not reachable ({exc!r})", 400)
    await state.registry.mark_healthy(worker)
    return JSONResponse(worker.describe(), status_code=201)


async def _flush_one(client: httpx.AsyncClient, worker: Any) -> tuple[str, int | str]:
    try:
        resp = await client.post(worker.url + "/flush_cache", headers=worker.headers(), timeout=30)
        return worker.url, resp.status_code
    except httpx.HTTPError as exc:
        return worker.url, type(exc).__name__


async def _flush_all(request: Request) -> Response:
    state = request.app.state.router
    workers = state.registry.available()
    results = dict(await asyncio.gather(*(_flush_one(state.client, w) for w in workers)))
    ok = all(code == 200 for code in results.values())
    # 200 only when every worker flushed: a worker busy with requests answers 400 (SGLang's
    # rule), and the caller should know the cache is not empty there.
    return JSONResponse({"success": ok, "workers": results}, status_code=200 if ok else 502)


def install_admin_routes(app: FastAPI) -> None:
    @app.post("/flush_cache")
    async def flush_cache(request: Request) -> Response:
        return _denied(request) or await _flush_all(request)

    @app.get("/workers")
    async def list_workers(request: Request) -> Response:
        denied = _denied(request)
        if denied:
            return denied
        workers = request.app.state.router.registry.workers.values()
        return JSONResponse({"workers": [w.describe() for w in workers]})

    @app.post("/workers")
    async def add_worker(request: Request) -> Response:
        return _denied(request) or await _add_worker(request)

    @app.delete("/workers")
    @app.delete("/workers/{url:path}")
    async def remove_worker(request: Request, url: str = "") -> Response:
        """The URL as a path (percent-encoded) or as `?url=`."""
        denied = _denied(request)
        if denied:
            return denied
        url = url or request.query_params.get("url", "")
        try:
            worker = await request.app.state.router.registry.remove(
                normalize_url(split_engine_api(url)[1])
            )
        except (KeyError, ValueError):
            return error_response(f"url: no worker {url} is registered", 404)
        return JSONResponse({"removed": worker.url})
