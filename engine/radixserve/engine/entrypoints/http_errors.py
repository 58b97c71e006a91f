"""HTTP errors of the engine, in OpenAI's JSON shape
`{"object": "error", "message", "type", "param", "code"}` (radixserve.protocol.http_edge, which
the router answers with too).

Only a validation error (`InvalidRequest`, raised while validating a request at the edge) is a
400, its `param` naming the field. `HTTPError` carries another status the edge chose (an engine
abort's 503, ...). Anything else is a bug: a 500 whose body carries the request id, with the
traceback logged under that id. Every response carries `X-Request-ID`.
"""

from __future__ import annotations

import logging
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from radixserve.asgi_errors import EdgeConfig, install_edge_middleware
from radixserve.engine.entrypoints.request_builder import InvalidRequest
from radixserve.protocol.http_edge import error_response
from radixserve.protocol.json_body import BodyError, parse_json_object

logger = logging.getLogger(__name__)


class HTTPError(Exception):
    """A response the edge decided on: this status and message (not a bug, not a 400)."""

    def __init__(self, message: str, status_code: int) -> None:
        super().__init__(message)
        self.status_code = status_code


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


def install_error_handlers(app: FastAPI, edge: EdgeConfig | None = None) -> None:
    """The engine's error answers, plus the edge middleware the router installs too (request
    id, body limit, API key: radixserve.asgi_errors.install_edge_middleware)."""

    @app.exception_handler(InvalidRequest)
    async def _invalid(_: Request, exc: InvalidRequest) -> JSONResponse:
        return error_response(str(exc), 400, exc.field)

    @app.exception_handler(HTTPError)
    async def _http_error(_: Request, exc: HTTPError) -> JSONResponse:
        return error_response(str(exc), exc.status_code)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_describe(exc), 400)

    install_edge_middleware(app, edge or EdgeConfig())
