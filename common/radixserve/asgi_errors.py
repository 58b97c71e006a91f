"""The last line of defence of the engine's and the router's HTTP servers: an exception no
route or handler took becomes a logged, JSON 500 that names the request id, in OpenAI's error
shape, instead of Starlette's plain-text 500 (or a reset connection).

Pure ASGI, because a `BaseHTTPMiddleware` would hide client disconnects from the routes.
Every response carries `X-Request-ID` (the client's, or a fresh id), and the id is in
`REQUEST_ID` for the log records made while the request is served.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from radixserve.logging_setup import REQUEST_ID, REQUEST_ID_HEADER

logger = logging.getLogger(__name__)


def internal_error_body(exc: BaseException, request_id: str) -> dict[str, Any]:
    return {
        "object": "error",
        "message": f"internal error: {type(exc).__name__}",
        "type": "InternalServerError",
        "param": None,
        "code": 500,
        "request_id": request_id,
    }


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
