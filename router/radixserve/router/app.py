"""The router's FastAPI app: proxied inference routes, health, metrics.

`/v1/completions`, `/v1/chat/completions` and `/generate` are tokenized exactly as the engine
will (for the prefix match) and forwarded; the engine stays the judge of the request's
content, so a body the router cannot tokenize is still forwarded and the worker answers it.
The router itself only rejects what it cannot forward at all (a body that is not a JSON
object, or holds NaN or Infinity), with the 400 naming the field that the engine gives.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from radixserve.asgi_errors import EdgeConfig, install_edge_middleware
from radixserve.protocol.http_api import INFERENCE_BODIES, openapi_with_bodies
from radixserve.protocol.http_edge import error_response
from radixserve.protocol.json_body import BodyError, parse_json_object
from radixserve.router.admin import install_admin_routes
from radixserve.router.auth import is_open_path
from radixserve.router.config import RouterConfig
from radixserve.router.proxy import no_worker_response
from radixserve.router.state import RouterState

PROXIED_ROUTES = ("/generate", "/v1/completions", "/v1/chat/completions")
OFFLOAD_TOKENIZE_BYTES = 64 * 1024  # bodies above this are tokenized on a worker thread


def st(request: Request) -> RouterState:
    state: RouterState = request.app.state.router
    return state


async def routing_tokens(
    state: RouterState, route: str, body: dict[str, Any], body_bytes: int
) -> list[int] | None:
    tokenizer = await state.tokenizers.get(state.registry)
    if tokenizer is None:
        return None
    start = time.perf_counter()
    try:
        if body_bytes > OFFLOAD_TOKENIZE_BYTES:  # ~1 ms per 1.5k tokens: keep the loop free
            tokens = await asyncio.to_thread(tokenizer.routing_tokens, route, body)
        else:
            tokens = tokenizer.routing_tokens(route, body)
    except ValueError:
        return None  # e.g. a chat template error: the worker will answer it with a 400
    state.metrics.tokenize.observe(time.perf_counter() - start)
    return tokens


def install_inference_routes(app: FastAPI) -> None:
    async def proxied(request: Request) -> Response:
        raw = await request.body()
        try:
            body = parse_json_object(raw)
        except BodyError as exc:
            return error_response(str(exc), 400, exc.field)
        state = st(request)
        route = request.url.path
        tokens = await routing_tokens(state, route, body, len(raw))
        return await state.proxy.forward(route, raw, body, tokens, request.headers)

    for route in PROXIED_ROUTES:
        app.add_api_route(route, proxied, methods=["POST"])

    @app.get("/v1/models")
    async def models(request: Request) -> Response:
        state = st(request)
        names = sorted({w.model_name for w in state.registry.available() if w.model_name})
        if not names:
            return no_worker_response()
        data = [{"id": n, "object": "model", "owned_by": "radixserve"} for n in names]
        return JSONResponse({"object": "list", "data": data})


def install_health_routes(app: FastAPI) -> None:
    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}  # liveness: the router process answers

    @app.get("/readiness")
    async def readiness(request: Request) -> Response:
        healthy = len(st(request).registry.available())
        if not healthy:
            return no_worker_response()
        return JSONResponse({"status": "ready", "healthy_workers": healthy})

    @app.get("/metrics")
    async def metrics(request: Request) -> Response:
        return Response(st(request).metrics.render(), media_type="text/plain; version=0.0.4")


def create_app(config: RouterConfig) -> FastAPI:
    state = RouterState.build(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = FastAPI(title="radixserve router", lifespan=lifespan)
    app.state.router = state
    install_inference_routes(app)
    install_health_routes(app)
    install_admin_routes(app)
    app.openapi = openapi_with_bodies(app.openapi, INFERENCE_BODIES)  # type: ignore[method-assign]
    edge = EdgeConfig(config.max_request_body_bytes, config.api_key, is_open_path)
    install_edge_middleware(app, edge)
    return app
