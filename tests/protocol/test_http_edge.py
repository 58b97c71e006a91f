"""The HTTP edge the engine and the router share: one error body per status (with `param`), the
in-stream error event, and the API-key check (constant-time; right key only)."""

from __future__ import annotations

import json

import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from radixserve.protocol.http_edge import (
    API_KEY_REFUSED,
    ApiKeyMiddleware,
    bearer_matches,
    error_body,
    error_response,
    sse_error,
)

TYPES = [
    (400, "BadRequestError"),
    (401, "AuthenticationError"),
    (404, "NotFoundError"),
    (413, "RequestTooLargeError"),
    (500, "InternalServerError"),
    (502, "BadGatewayError"),
    (503, "ServiceUnavailableError"),
    (418, "Error"),  # a status without a name of its own
]


@pytest.mark.parametrize(("status", "kind"), TYPES)
def test_error_body_has_openais_fields_for_every_status(status: int, kind: str) -> None:
    body = error_body("went wrong", status)
    assert body == {
        "object": "error",
        "message": "went wrong",
        "type": kind,
        "param": None,
        "code": status,
    }


def test_error_body_names_the_field_and_the_request_id_when_given() -> None:
    body = error_body("top_p: too big", 400, "top_p", request_id="abc")
    assert (body["param"], body["request_id"]) == ("top_p", "abc")


def test_error_response_carries_status_body_and_headers() -> None:
    resp = error_response("busy", 503, headers={"Retry-After": "5"})
    assert resp.status_code == 503
    assert resp.headers["retry-after"] == "5"
    assert json.loads(bytes(resp.body)) == error_body("busy", 503)


def test_sse_error_is_one_data_event_holding_the_error_body() -> None:
    event = sse_error("replica died", 502)
    assert event.startswith(b"data: ") and event.endswith(b"\n\n")
    assert json.loads(event[len(b"data: ") :]) == {"error": error_body("replica died", 502)}


@pytest.mark.parametrize(
    ("header", "accepted"),
    [
        (b"Bearer s3cret", True),
        (b"Bearer s3cres", False),  # one character off
        (b"Bearer s3cret ", False),
        (b"bearer s3cret", False),
        (b"s3cret", False),
        (b"Bearer ", False),
        (b"", False),  # no header at all reads as empty
    ],
)
def test_bearer_matches_only_the_exact_key(header: bytes, accepted: bool) -> None:
    assert bearer_matches(header, "s3cret") is accepted


def test_an_empty_key_matches_nothing() -> None:
    assert not bearer_matches(b"Bearer ", "")
    assert not bearer_matches(b"", "")


def _client() -> TestClient:
    async def ok(_: Request) -> PlainTextResponse:
        return PlainTextResponse("ok")

    app = Starlette(routes=[Route("/v1/models", ok), Route("/health", ok)])
    app.add_middleware(ApiKeyMiddleware, api_key="s3cret", is_open={"/health"}.__contains__)
    return TestClient(app)


@pytest.mark.parametrize(
    "headers",
    [{"Authorization": "Bearer wrong"}, {"Authorization": ""}, {}],
    ids=["wrong", "empty", "missing"],
)
def test_middleware_refuses_a_wrong_empty_or_missing_key_with_a_401(
    headers: dict[str, str],
) -> None:
    resp = _client().get("/v1/models", headers=headers)
    assert resp.status_code == 401
    assert resp.json() == error_body(API_KEY_REFUSED, 401)


def test_middleware_passes_the_right_key_and_open_paths() -> None:
    client = _client()
    assert client.get("/v1/models", headers={"Authorization": "Bearer s3cret"}).text == "ok"
    assert client.get("/health").text == "ok"
