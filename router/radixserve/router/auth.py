"""Which paths the router's client API key guards: with `--api-key` (or
$RADIXSERVE_ROUTER_API_KEY) every path but the probes' and the admin API's needs
`Authorization: Bearer <key>` (radixserve.protocol.http_edge.ApiKeyMiddleware, the engine's
check too); the admin API checks its own key (`--admin-key`)."""

from __future__ import annotations

OPEN_PATHS = frozenset({"/health", "/readiness", "/metrics"})  # probes and Prometheus
ADMIN_PATHS = ("/workers", "/flush_cache")


def is_open_path(path: str) -> bool:
    """A path the client key does not guard: a probe's, or the admin API's (its own key)."""
    return path in OPEN_PATHS or any(path == p or path.startswith(p + "/") for p in ADMIN_PATHS)
