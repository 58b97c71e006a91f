"""How the router addresses what it routes to: a worker (by URL) and its DP ranks.

A *rank* is one DP rank of one worker, keyed `(worker url, dp_rank)`: the unit a policy scores.
A worker without data parallelism has one rank (0). Each rank has its own KV-event stream
(SGLang publishes one per attention-DP rank), hence its own mirror tree.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import urlsplit

RankKey = tuple[str, int]  # (worker url, dp_rank)


@dataclass(frozen=True)
class KVEndpoint:
    """Where one DP rank publishes its KV events (ZMQ PUB) and answers replays (ZMQ ROUTER)."""

    dp_rank: int
    endpoint: str
    replay_endpoint: str | None = None
    topic: str = ""


def normalize_url(url: str) -> str:
    """`host:port` or `http://host:port/` → `http://host:port`; raises ValueError naming `url`."""
    url = url.strip().rstrip("/")
    if "://" not in url:
        url = "http://" + url
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"url: expected http://host:port, got {url!r}")
    try:
        parts.port  # noqa: B018 - raises ValueError on a bad port
    except ValueError:
        raise ValueError(f"url: bad port in {url!r}") from None
    return url


def reachable_endpoint(endpoint: str, worker_url: str) -> str:
    """An engine bound to 0.0.0.0 / [::] / * advertises that address; dial the worker's host."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if host in ("0.0.0.0", "*", "[::]", "::", ""):
        worker_host = urlsplit(worker_url).hostname or "127.0.0.1"
        host = f"[{worker_host}]" if ":" in worker_host else worker_host
    return f"{scheme}://{host}:{port}"
