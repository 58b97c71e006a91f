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
from dataclasses import dataclass, field, replace
from typing import Any

import httpx

from radixserve.router.config import RouterConfig
from radixserve.router.metrics import RouterMetrics
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.mirror.inflight import OverlayLimits
from radixserve.router.pd import PDProxy
from radixserve.router.policies import make_policy
from radixserve.router.proxy import Proxy
from radixserve.router.selector import Selector
from radixserve.router.tokenization import RouterTokenizer
from radixserve.router.upstream import Upstream
from radixserve.router.workers import WorkerRegistry

logger = logging.getLogger(__name__)

POOL_LIMITS = httpx.Limits(max_connections=1024, max_keepalive_connections=256)


def _pool(
    config: RouterConfig, client: httpx.AsyncClient, policy: str
) -> tuple[CacheIndex, WorkerRegistry, Selector]:
    """One pool of workers: its mirror of their caches, its registry, its selector."""
    limits = OverlayLimits(config.inflight_ttl_s, max_tokens=config.inflight_max_tokens)
    index = CacheIndex(approx_max_tokens=config.approx_max_tokens, overlay_limits=limits)
    registry = WorkerRegistry(config, client, index)
    chosen = replace(config, policy=policy) if policy != config.policy else config
    credits = config.tier_credits()
    selector = Selector(
        registry,
        index,
        make_policy(chosen),
        credits.get("host", 0.0),
        credits.get("storage", 0.0),
    )
    return index, registry, selector


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
    # --pd-disaggregation: `registry` holds the prefill workers, this the decode workers; the
    # proxy is then a PDProxy
    decode: Proxy | None = None
    pd: PDProxy | None = None

    @classmethod
    def build(cls, config: RouterConfig) -> RouterState:
        client = httpx.AsyncClient(limits=POOL_LIMITS, timeout=config.request_timeout_s)
        upstream = Upstream(config)
        index, registry, selector = _pool(config, client, config.pd_prefill_policy)
        metrics = RouterMetrics(registry, index)
        proxy = Proxy(config, upstream, selector, registry, metrics)
        tokenizers = TokenizerSource(config.tokenizer_path)
        state = cls(config, client, upstream, index, registry, selector, proxy, metrics, tokenizers)
        if config.pd_disaggregation:
            _, d_registry, d_selector = _pool(config, client, config.pd_decode_policy)
            state.decode = Proxy(config, upstream, d_selector, d_registry, metrics)
            state.pd = PDProxy(config, upstream, proxy, state.decode, metrics)
        return state

    @property
    def forwarder(self) -> Proxy | PDProxy:
        """Where the proxied routes send a request."""
        return self.pd if self.pd is not None else self.proxy

    def registries(self) -> list[WorkerRegistry]:
        return [self.registry] + ([self.decode.registry] if self.decode is not None else [])

    async def start(self) -> None:
        await self.index.start()
        for url in self.config.worker_urls + self.config.prefill_urls:
            self.registry.add(url, source="static")
        if self.decode is not None:
            await self.decode.registry.index.start()
            for url in self.config.decode_urls:
                self.decode.registry.add(url, source="static")
        loop = asyncio.get_running_loop()
        for i, registry in enumerate(self.registries()):
            await registry.check_all()  # workers already up are routable at once
            self.tasks += [
                loop.create_task(registry.health_loop(), name=f"health{i}"),
                loop.create_task(registry.load_loop(), name=f"load{i}"),
            ]
        watched = [(self.config.k8s_service, self.registry)]
        watched.append((self.config.k8s_prefill_service, self.registry))
        if self.decode is not None:
            watched.append((self.config.k8s_decode_service, self.decode.registry))
        for service, registry in watched:
            if not service:
                continue
            from radixserve.router.k8s_discovery import watch_endpoint_slices

            watch = watch_endpoint_slices(self.config, registry, service)
            self.tasks.append(loop.create_task(watch, name=f"k8s-{service}"))

    async def stop(self) -> None:
        for task in self.tasks:
            task.cancel()
        for task in self.tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self.tasks.clear()
        if self.decode is not None:
            await self.decode.registry.index.aclose()
        await self.index.aclose()
        await self.upstream.aclose()
        await self.client.aclose()
