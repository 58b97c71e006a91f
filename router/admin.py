"""The worker admin API: `GET/POST/DELETE /workers`, behind `Authorization: Bearer <admin key>`.

POST registers a worker only after it answered `/server_info` (an unreachable URL is a 400,
not a silent pending entry); DELETE drops it and its mirrors. Without `--admin-key` the API
is closed: every call is a 401 that says how to open it.
"""

from __future__ import annotations

import hmac
from typing import Any

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixserve.router.proxy import error_response
from radixserve.router.targets import normalize_url


def _denied(request: Request) -> Response | None:
    key = request.app.state.router.config.admin_key
    if key is None:
        return error_response("admin API is closed: start the router with --admin-key", 401)
    given = request.headers.get("authorization", "")
    if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
        return error_response("invalid or missing admin key", 401)
    return None


async def _add_worker(request: Request) -> Response:
    state = request.app.state.router
    try:
        body: Any = await request.json()
    except ValueError:
        return error_response("body: malformed JSON", 400)
    if not isinstance(body, dict) or not isinstance(body.get("url"), str):
        return error_response("url: expected a string such as http://host:port", 400)
    try:
        url = normalize_url(body["url"])
        worker = state.registry.add(url, body.get("api_key"), source="admin")
    except ValueError as exc:
        return error_response(str(exc), 400)
    try:
        await state.registry.probe(worker)
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        await state.registry.remove(url)
        return error_response(f"url: worker {url} is not reachable ({exc!r})", 400)
    await state.registry.mark_healthy(worker)
    return JSONResponse(worker.describe(), status_code=201)


def install_admin_routes(app: FastAPI) -> None:
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
            worker = await request.app.state.router.registry.remove(normalize_url(url))
        except (KeyError, ValueError):
            return error_response(f"url: no worker {url} is registered", 404)
        return JSONResponse({"removed": worker.url})
