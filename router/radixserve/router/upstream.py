"""The data plane's client to the workers: one aiohttp session for the proxied requests.

aiohttp parses responses in C and keeps a keep-alive pool whose cost does not grow with the
number of connections it holds; measured on the router's own load (`bench router-overhead`),
it costs ~0.07 ms of CPU per request where httpx cost 0.5 ms at one request in flight and
1.9 ms at 32 (its pool scans every connection on each request). The control plane (health
checks, load polls, probes, the admin API, the tokenizer fetch) keeps httpx: a few requests a
second.

Limits and timeouts are those the httpx client had: 1024 connections, connecting within
`connect_timeout_s`, every read (and the wait for a free connection) within
`request_timeout_s`, a proxy from the environment (`HTTP_PROXY`, `NO_PROXY`, …; looked up once
per worker, not per request as aiohttp's `trust_env` does, on a thread). An idle connection is
dropped after 4 s, before the engine's server (uvicorn: 5 s) closes it under a request. No
cookie jar: a cookie one worker answer sets is not sent with other clients' requests.
"""

from __future__ import annotations

import asyncio

import aiohttp
from aiohttp.helpers import get_env_proxy_for_url
from yarl import URL

from radixserve.router.config import RouterConfig

MAX_CONNECTIONS = 1024
KEEPALIVE_S = 4.0
# What can go wrong between the router and a worker: refused or timed-out connections, a
# worker that goes away before or during its answer, a malformed answer.
TRANSPORT_ERRORS: tuple[type[BaseException], ...] = (aiohttp.ClientError, asyncio.TimeoutError)


def is_connect_error(exc: BaseException) -> bool:
    """Nothing listens there (refused, unresolvable): unambiguous, unlike a timeout."""
    return isinstance(exc, aiohttp.ClientConnectorError)


class Upstream:
    """The session, made in the running loop on first use and closed with the app."""

    def __init__(self, config: RouterConfig) -> None:
        self.timeout = aiohttp.ClientTimeout(
            total=None,
            connect=config.request_timeout_s,  # a free connection, then connecting
            sock_connect=config.connect_timeout_s,
            sock_read=config.request_timeout_s,
        )
        self._session: aiohttp.ClientSession | None = None
        self._proxies: dict[str, tuple[URL | None, aiohttp.BasicAuth | None]] = {}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            connector = aiohttp.TCPConnector(limit=MAX_CONNECTIONS, keepalive_timeout=KEEPALIVE_S)
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=self.timeout, cookie_jar=aiohttp.DummyCookieJar()
            )
        return self._session

    def proxy_for(self, worker_url: str) -> tuple[URL | None, aiohttp.BasicAuth | None]:
        """The environment's proxy for a worker (None: connect directly), and its login."""
        found = self._proxies.get(worker_url)
        if found is None:
            try:
                found = get_env_proxy_for_url(URL(worker_url))
            except LookupError:  # no proxy set for its scheme, or NO_PROXY names it
                found = (None, None)
            self._proxies[worker_url] = found
        return found

    async def aclose(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None
