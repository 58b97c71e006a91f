"""The last line of defence of the engine's and the router's HTTP servers: an exception no
route or handler took becomes a logged, JSON 500 that names the request id, in OpenAI's error
shape, instead of Starlette's plain-text 500 (or a reset connection).

Pure ASGI, because a `BaseHTTPMiddleware` would hide client disconnects from the routes.
Every response carries `X-Request-ID` (the client's, or a fresh id), and the id is in
`REQUEST_ID` for the log records made while the request is served.
"""

from __future__ import annotations

import logging
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.logging_setup import REQUEST_ID, REQUEST_ID_HEADER
from radixserve.protocol.http_edge import ApiKeyMiddleware, error_body

logger = logging.getLogger(__name__)


def internal_error_body(exc: BaseException, request_id: str) -> dict[str, Any]:
    return error_body(f"internal error: {type(exc).__name__}", 500, request_id=request_id)


class InternalErrorMiddleware:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = dict(scope.get("headers") or [])
        rid = headers.get(REQUEST_ID_HEADER, b"").decode() or uuid.uuid4().hex
        scope.setdefault("state", {})["request_id"] = rid
        REQUEST_ID.set(rid)
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
                message["headers"] = [
                    *message.get("headers", []),
                    (REQUEST_ID_HEADER, rid.encode()),
                ]
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        except Exception as exc:
            logger.exception(
                "internal error in %s %s (request id %s)", scope["method"], scope["path"], rid
            )
            if started:  # too late for a status: the connection is cut
                raise
            body = internal_error_body(exc, rid)
            headers_out = {REQUEST_ID_HEADER.decode(): rid}
            await JSONResponse(body, status_code=500, headers=headers_out)(scope, receive, send)


# ---- request body size ----------------------------------------------------------------------

# Long-context prompts as token-id JSON are a few MB; 32 MiB leaves room for chat histories
# and logit_bias maps while one request can no longer hold the server's memory hostage.
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
MAX_BODY_ENV = "RADIXSERVE_MAX_REQUEST_BODY_BYTES"


def max_body_bytes_from_env() -> int:
    """The body limit of this process: $RADIXSERVE_MAX_REQUEST_BODY_BYTES, else the default."""
    raw = os.environ.get(MAX_BODY_ENV, "").strip()
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_BODY_ENV}: expected a positive integer, got {raw!r}") from None
    if value < 1:
        raise ValueError(f"{MAX_BODY_ENV}: expected a positive integer, got {value}")
    return value


class _BodyTooLarge(Exception):
    pass


def body_too_large_body(limit: int) -> dict[str, Any]:
    message = f"body: the request body is larger than this server's limit of {limit} bytes"
    return error_body(message, 413, "body")


class BodyLimitMiddleware:
    """A request body over `max_bytes` is a JSON 413 naming the limit: at once when its
    Content-Length says so, else as soon as the bytes read pass it (a chunked upload), so the
    server never holds more than the limit of one body. Pure ASGI: disconnects still reach the
    routes. Sits inside InternalErrorMiddleware, which then adds the request id."""

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = dict(scope.get("headers") or []).get(b"content-length", b"")
        if length.isdigit() and int(length) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _BodyTooLarge:
            if started:  # a route that answered before reading its whole body: cut it
                raise
            await self._refuse(scope, receive, send)

    async def _refuse(self, scope: Scope, receive: Receive, send: Send) -> None:
        body = body_too_large_body(self.max_bytes)
        await JSONResponse(body, status_code=413, headers={"Connection": "close"})(
            scope, receive, send
        )


# ---- the stack both servers install ---------------------------------------------------------


@dataclass(frozen=True)
class EdgeConfig:
    """What a server's edge enforces: the body limit (None: the environment's, else the
    default) and, with `api_key`, the key on every path `is_open` refuses."""

    max_body_bytes: int | None = None
    api_key: str | None = field(default=None, repr=False)
    is_open: Callable[[str], bool] = lambda _: False


def install_edge_middleware(app: Starlette, edge: EdgeConfig) -> None:
    """The engine's and the router's middleware. Outermost first: the request id and the 500
    guard, so every answer (a 401 or a 413 too) carries X-Request-ID; the body limit; the key
    check."""
    if edge.api_key:
        app.add_middleware(ApiKeyMiddleware, api_key=edge.api_key, is_open=edge.is_open)
    limit = edge.max_body_bytes or max_body_bytes_from_env()
    app.add_middleware(BodyLimitMiddleware, max_bytes=limit)
    app.add_middleware(InternalErrorMiddleware)  # added last: Starlette runs it first
