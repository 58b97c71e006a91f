"""The HTTP edge that the engine and the router share, so a client sees one answer from either:
the error body, the in-stream error event and the API-key check. No state, no torch.

Errors keep SGLang's flat form of OpenAI's error object,
`{"object": "error", "message", "type", "param", "code"}`, with the request id added on a 500.
"""

from __future__ import annotations

import hmac
import json
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.protocol.json_body import BodyError, parse_json_object

ERROR_TYPES: Mapping[int, str] = MappingProxyType(
    {
        400: "BadRequestError",
        401: "AuthenticationError",
        404: "NotFoundError",
        413: "RequestTooLargeError",
        500: "InternalServerError",
        502: "BadGatewayError",
        503: "ServiceUnavailableError",
    }
)
API_KEY_REFUSED = "invalid or missing API key"
SSE_DONE = b"data: [DONE]\n\n"  # the last event of every stream, after an error event too


def error_body(
    message: str, status: int, param: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    """The error object; `param` names the offending field of a 400 (else None)."""
    body: dict[str, Any] = {
        "object": "error",
        "message": message,
        "type": ERROR_TYPES.get(status, "Error"),
        "param": param,
        "code": status,
    }
    if request_id is not None:
        body["request_id"] = request_id
    return body


def error_response(
    message: str,
    status: int,
    param: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> JSONResponse:
    body = error_body(message, status, param)
    return JSONResponse(body, status_code=status, headers=dict(headers or {}))


async def read_json_body(request: Request) -> dict[str, Any] | JSONResponse:
    """The body as a JSON object, else the 400 naming the field (json_body's parser): the
    router's answer, and the engine's through its InvalidRequest handler. A NaN or Infinity
    could not be forwarded anyway: the router writes standard JSON only."""
    try:
        return parse_json_object(await request.body())
    except BodyError as exc:
        return error_response(str(exc), 400, exc.field)


def sse_error(message: str, status: int) -> bytes:
    """The error event that ends a stream that already started; the caller then sends
    SSE_DONE, the end marker clients wait for."""
    return f"data: {json.dumps({'error': error_body(message, status)})}\n\n".encode()


def bearer_matches(authorization: bytes, key: str) -> bool:
    """Whether an `Authorization` header value is `Bearer <key>`. Constant time
    (hmac.compare_digest), so the answer's timing says nothing about how much of the key a guess
    got right. An empty key matches nothing: a server must never be opened by a blank setting."""
    return bool(key) and hmac.compare_digest(authorization, f"Bearer {key}".encode())


class ApiKeyMiddleware:
    """Every HTTP path but those `is_open` accepts needs `Authorization: Bearer <api_key>`, else
    a 401. Pure ASGI, so that routes (and proxied streams) still see client disconnects."""

    def __init__(self, app: ASGIApp, api_key: str, is_open: Callable[[str], bool]) -> None:
        self.app = app
        self.api_key = api_key
        self.is_open = is_open

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not self.is_open(scope["path"]):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not bearer_matches(given, self.api_key):
                await error_response(API_KEY_REFUSED, 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
