"""A bug inside the router (an exception no handler takes) answers a JSON 500 in OpenAI's error
shape naming the request id, is logged under that id, and leaves the app serving; the client's
X-Request-ID is kept. The failing route is added to the real app for the test."""

from __future__ import annotations

import asyncio
import logging

import httpx
import pytest

from radixserve.router.app import create_app
from radixserve.router.config import RouterConfig


def _app_with_a_bug() -> object:
    app = create_app(RouterConfig())

    @app.get("/boom")
    async def boom() -> None:
        raise RuntimeError("a bug")

    return app


def test_an_unhandled_exception_is_a_json_500_with_the_request_id(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def scenario() -> tuple[httpx.Response, httpx.Response, httpx.Response]:
        transport = httpx.ASGITransport(app=_app_with_a_bug())  # type: ignore[arg-type]
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            fresh = await client.get("/boom")
            kept = await client.get("/boom", headers={"X-Request-ID": "req-42"})
            health = await client.get("/health")
            return fresh, kept, health

    with caplog.at_level(logging.ERROR, logger="radixserve.asgi_errors"):
        fresh, kept, health = asyncio.run(scenario())
    assert fresh.status_code == 500
    body = fresh.json()
    assert body["object"] == "error" and body["code"] == 500
    assert body["message"] == "internal error: RuntimeError"
    assert body["request_id"] == fresh.headers["x-request-id"] and len(body["request_id"]) == 32
    assert kept.status_code == 500 and kept.json()["request_id"] == "req-42"
    assert kept.headers["x-request-id"] == "req-42"
    assert any("req-42" in r.getMessage() and r.exc_info for r in caplog.records)
    assert health.status_code in (200, 503)  # the app still answers (503: no workers yet)
