"""The router's edge through the real app (no workers needed: each answer comes before any
forwarding): the client key guards the proxied routes but not the probes or the admin API, and
a body the router refuses is a 400 whose `param` names the field, as the engine's is."""

from __future__ import annotations

import asyncio

import httpx

from radixserve.protocol.http_edge import API_KEY_REFUSED
from radixserve.router.app import create_app
from radixserve.router.config import RouterConfig

KEY = {"Authorization": "Bearer k3y"}


def _ask(
    config: RouterConfig, *calls: tuple[str, str, dict[str, str], bytes]
) -> list[httpx.Response]:
    async def scenario() -> list[httpx.Response]:
        transport = httpx.ASGITransport(app=create_app(config))
        async with httpx.AsyncClient(transport=transport, base_url="http://router") as client:
            return [
                await client.request(method, path, headers=headers, content=body)
                for method, path, headers, body in calls
            ]

    return asyncio.run(scenario())


def test_the_client_key_guards_proxied_routes_only() -> None:
    wrong, missing, right, health, admin = _ask(
        RouterConfig(api_key="k3y"),
        ("POST", "/generate", {"Authorization": "Bearer nope"}, b"[]"),
        ("POST", "/generate", {}, b"[]"),
        ("POST", "/generate", KEY, b"[]"),
        ("GET", "/health", {}, b""),
        ("GET", "/workers", {}, b""),
    )
    for resp in (wrong, missing):
        assert resp.status_code == 401
        assert resp.json()["message"] == API_KEY_REFUSED
        assert resp.headers["x-request-id"]  # the key check sits inside the request-id guard
    assert right.status_code == 400  # past the key: the body is refused instead
    assert health.status_code in (200, 503)  # open (503: no workers yet)
    assert "admin" in admin.json()["message"]  # the admin API's own key, not the client's


def test_a_refused_body_names_the_field_in_param() -> None:
    (resp,) = _ask(RouterConfig(), ("POST", "/generate", {}, b'{"temperature": NaN}'))
    assert resp.status_code == 400
    assert resp.json()["param"] == "temperature"
    assert resp.json()["type"] == "BadRequestError"
