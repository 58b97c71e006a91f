"""The router's app: proxied inference routes, health, metrics, the admin API.

`/v1/completions`, `/v1/chat/completions` and `/generate` are tokenized exactly as the engine
will (for the prefix match) and forwarded; the engine stays the judge of the request's
content, so a body the router cannot tokenize is still forwarded and the worker answers it.
The router itself only rejects what it cannot forward at all (a body that is not a JSON
object, or holds NaN or Infinity), with the 400 naming the field that the engine gives.

`RouterApp` is FastAPI with one difference: a POST to a proxied route skips the middleware
stack and is served by `edge.LeanProxiedRoutes`, which does the stack's work in one function.
FastAPI's own routes for them stay, as the reference path and for /openapi.json.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response
from starlette.types import Receive, Scope, Send

from radixserve.asgi_errors import EdgeConfig, install_edge_middleware, max_body_bytes_from_env
from radixserve.protocol.http_api import INFERENCE_BODIES, openapi_with_bodies
from radixserve.router.admin import install_admin_routes
from radixserve.router.auth import is_open_path
from radixserve.router.config import RouterConfig
from radixserve.router.edge import PROXIED_ROUTES, LeanProxiedRoutes, answer
from radixserve.router.proxy import no_worker_response
from radixserve.router.state import RouterState


def st(request: Request) -> RouterState:
    state: RouterState = request.app.state.router
    return state


class RouterApp(FastAPI):
    """FastAPI, but a POST to a proxied route goes to `lean` (set by create_app) directly."""

    lean: LeanProxiedRoutes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if (
            scope["type"] == "http"
            and scope["method"] == "POST"
            and scope["path"] in PROXIED_ROUTES
            and not scope.get("root_path")  # a mounted app: FastAPI resolves the path
        ):
            await self.lean(scope, receive, send)
        else:
            await super().__call__(scope, receive, send)


def install_inference_routes(app: FastAPI) -> None:
    async def proxied(request: Request) -> Response:
        return await answer(st(request), request.url.path, await request.body(), request.headers)

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


def create_app(config: RouterConfig) -> RouterApp:
    state = RouterState.build(config)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await state.start()
        try:
            yield
        finally:
            await state.stop()

    app = RouterApp(title="radixserve router", lifespan=lifespan)
    app.state.router = state
    install_inference_routes(app)
    install_health_routes(app)
    install_admin_routes(app)
    app.openapi = openapi_with_bodies(app.openapi, INFERENCE_BODIES)  # type: ignore[method-assign]
    edge = EdgeConfig(config.max_request_body_bytes, config.api_key, is_open_path)
    install_edge_middleware(app, edge)
    limit = edge.max_body_bytes or max_body_bytes_from_env()
    app.lean = LeanProxiedRoutes(state, edge, limit)
    return app
