"""RouterState: everything one router process holds, built from its RouterConfig.

The lifespan of the app owns the background tasks (health checks, load polls, discovery)
and the clients (httpx for the control plane, upstream.Upstream for the proxied requests); nothing
here is module-global.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixserve.router.config import RouterConfig
from radixserve.router.metrics import RouterMetrics
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.mirror.inflight import OverlayLimits
from radixserve.router.policies import make_policy
from radixserve.router.proxy import Proxy
from radixserve.router.selector import Selector
from radixserve.router.tokenization import RouterTokenizer
from radixserve.router.upstream import Upstream
from radixserve.router.workers import WorkerRegistry

logger = logging.getLogger(__name__)

POOL_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=256)


class TokenizerSource:
    """The router's tokenizer: a local file, or fetched once from the first healthy worker."""

    def __init__(self, path: str | None) -> None:
        self.tokenizer = RouterTokenizer.from_file(path) if path else None
        self._lock = asyncio.Lock()
        self._next_try = 0.0
        self._last_error: str | None = None  # logged once per change (vLLM has no tokenizer route)

    async def get(self, registry: WorkerRegistry) -> RouterTokenizer | None:
        if self.tokenizer is not None:
            return self.tokenizer
        async with self._lock:
            if self.tokenizer is not None or time.monotonic() < self._next_try:
                return self.tokenizer
            for worker in registry.available():
                try:
                    self.tokenizer = await RouterTokenizer.fetch(
                        registry.client, worker.url, worker.headers()
                    )
                    logger.info("tokenizer loaded from=%s", worker.url)
                    return self.tokenizer
                except (httpx.HTTPError, ValueError, KeyError) as exc:
                    error = f"from={worker.url} error={exc!r}"
                    if error != self._last_error:  # e.g. vLLM: no /get_tokenizer, every try
                        self._last_error = error
                        logger.warning(
                            "tokenizer fetch failed %s (routing by prefix needs "
                            "--tokenizer-path for engines without /get_tokenizer)",
                            error,
                        )
            self._next_try = time.monotonic() + 1.0  # do not hammer workers on every request
        return None


@dataclass
class RouterState:
    config: RouterConfig
    client: httpx.AsyncClient  # the control plane's (health, loads, probes, admin)
    upstream: Upstream  # the proxied requests'
    index: CacheIndex
    registry: WorkerRegistry
    selector: Selector
    proxy: Proxy
    metrics: RouterMetrics
    tokenizers: TokenizerSource
    tasks: list[asyncio.Task[Any]] = field(default_factory=list)

    @classmethod
    def build(cls, config: RouterConfig) -> RouterState:
        client = httpx.AsyncClient(limits=POOL_LIMITS, timeout=config.request_timeout_s)
        limits = OverlayLimits(config.inflight_ttl_s, max_tokens=config.inflight_max_tokens)
        index = CacheIndex(approx_max_tokens=config.approx_max_tokens, overlay_limits=limits)
        registry = WorkerRegistry(config, client, index)
        selector = Selector(registry, index, make_policy(config))
        metrics = RouterMetrics(registry, index)
        upstream = Upstream(config)
        proxy = Proxy(config, upstream, selector, registry, metrics)
        tokenizers = TokenizerSource(config.tokenizer_path)
        return cls(config, client, upstream, index, registry, selector, proxy, metrics, tokenizers)

    async def start(self) -> None:
        await self.index.start()
        for url in self.config.worker_urls:
            self.registry.add(url, source="static")
        await self.registry.check_all()  # workers already up are routable at once
        loop = asyncio.get_running_loop()
        self.tasks += [
            loop.create_task(self.registry.health_loop(), name="health"),
            loop.create_task(self.registry.load_loop(), name="load"),
        ]
        if self.config.k8s_service:
            from radixserve.router.k8s_discovery import watch_endpoint_slices

            self.tasks.append(
                loop.create_task(watch_endpoint_slices(self.config, self.registry), name="k8s")
            )

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        await self.index.aclose()
        await self.upstream.aclose()
        await self.client.aclose()
