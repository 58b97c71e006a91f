"""JSON error responses in OpenAI's shape: {"object": "error", "message", "type", "code"}."""

from __future__ import annotations

import json
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse

from radixserve.engine.managers.tokenizer_manager import RequestError

_TYPES = {
    400: "BadRequestError",
    401: "AuthenticationError",
    404: "NotFoundError",
    503: "ServiceUnavailableError",
    500: "InternalServerError",
}


def error_response(message: str, status_code: int = 400) -> JSONResponse:
    return JSONResponse(
        {
            "object": "error",
            "message": message,
            "type": _TYPES.get(status_code, "Error"),
            "code": status_code,
        },
        status_code=status_code,
    )


async def read_json_object(request: Request) -> dict[str, Any]:
    """The body as a JSON object; malformed JSON or another JSON type is a 400."""
    try:
        body = await request.json()
    except (json.JSONDecodeError, UnicodeDecodeError):
        raise RequestError("body: malformed JSON") from None
    if not isinstance(body, dict):
        raise RequestError("body: expected a JSON object")
    return body


def _describe(exc: RequestValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        parts.append(f"{loc or 'body'}: {err.get('msg', 'invalid')}")
    return "; ".join(parts) or "invalid request"


def install_error_handlers(app: FastAPI) -> None:
    @app.exception_handler(RequestError)
    async def _request_error(_: Request, exc: RequestError) -> JSONResponse:
        return error_response(str(exc), exc.status_code)

    @app.exception_handler(ValueError)
    async def _value_error(_: Request, exc: ValueError) -> JSONResponse:
        return error_response(str(exc), 400)

    @app.exception_handler(RequestValidationError)
    async def _validation_error(_: Request, exc: RequestValidationError) -> JSONResponse:
        return error_response(_describe(exc), 400)
