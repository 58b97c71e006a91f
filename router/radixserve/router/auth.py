"""The client API key: with `--api-key` (or $RADIXSERVE_ROUTER_API_KEY) every path but the
probes' and the admin API's needs `Authorization: Bearer <key>`; the admin API checks its own
key (`--admin-key`). Pure ASGI, so that proxied streams still see client disconnects."""

from __future__ import annotations

import hmac

from starlette.types import ASGIApp, Receive, Scope, Send

from radixserve.router.proxy import error_response

OPEN_PATHS = frozenset({"/health", "/readiness", "/metrics"})  # probes and Prometheus
ADMIN_PATHS = ("/workers", "/flush_cache")


def _exempt(path: str) -> bool:
    return path in OPEN_PATHS or any(path == p or path.startswith(p + "/") for p in ADMIN_PATHS)


class ClientKeyMiddleware:
    def __init__(self, app: ASGIApp, api_key: str) -> None:
        self.app = app
        self.expected = f"Bearer {api_key}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and not _exempt(scope["path"]):
            given = dict(scope.get("headers") or []).get(b"authorization", b"")
            if not hmac.compare_digest(given, self.expected):
                await error_response("invalid or missing API key", 401)(scope, receive, send)
                return
        await self.app(scope, receive, send)
