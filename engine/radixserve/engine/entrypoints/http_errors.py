"""HTTP errors of the engine, in OpenAI's JSON shape
`{"object": "error", "message", "type", "param", "code"}`.

Only a validation error (`InvalidRequest`, raised while validating a request at the edge) is a
400, its `param` naming the field. `HTTPError` carries another status the edge chose (an engine
abort's 503, ...). Anything else is a bug: a 500 whose body carries the request id, with the
traceback logged under that id. Every response carries `X-Request-ID`.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from radixserve.asgi_errors import (
    BodyLimitMiddleware,
    InternalErrorMiddleware,
    max_body_bytes_from_env,
)
from radixserve.engine.entrypoints.request_builder import InvalidRequest
from radixserve.protocol.json_body import BodyError, parse_json_object

logger = logging.getLogger(__name__)

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    413: "RequestTooLargeError",
    503: "ServiceUnavailableError",
    500: "InternalServerError",
}


class HTTPError(Exception):
    """A response the edge decided on: this status and message (not a bug, not a 400)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


def error_body(
    message: str, status_code: int, param: str | None = None, request_id: str | None = None
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "object": "error",
        "message": message,
        "type": _TYPES.get(status_code, "Error"),
        "param": param,
        "code": status_code,
    }
    if request_id is not None:
        body["request_id"] = request_id
    return body


def error_response(message: str, status_code: int, param: str | None = None) -> JSONResponse:
    return JSONResponse(error_body(message, status_code, param), status_code=status_code)


def sse_error(message: str, status_code: int) -> bytes:
    """The error event that ends a stream that already started (then `data: [DONE]`)."""
    return f"data: {json.dumps({'error': error_body(message, status_code)})}\n\n".encode()


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; malformed JSON, another JSON type or a NaN / Infinity
    anywhere in it is a 400 naming the field (the router's parser: the same answer there)."""
    try:
        return parse_json_object(await request.body())
    except BodyError as exc:
        raise InvalidRequest(str(exc)) from None


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI, max_body_bytes: int | None = None) -> None:
    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return error_response(str(exc), 400, exc.field)

    @app.exception_handler(HTTPError)
    async def _http_error(_: Request, exc: HTTPError) -> JSONResponse:
        return error_response(str(exc), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_describe(exc), 400)

    limit = max_body_bytes or max_body_bytes_from_env()  # --max-request-body-bytes, else env
    app.add_middleware(BodyLimitMiddleware, max_bytes=limit)
    app.add_middleware(InternalErrorMiddleware)
