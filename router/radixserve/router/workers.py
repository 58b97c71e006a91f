"""The router's view of its workers: registration, health, load, circuit breakers.

A worker is added by URL (static list, admin API or Kubernetes discovery) and stays *pending*
until its engine's API says what it is (`engine_api`: SGLang's `/server_info`, or vLLM's
`/v1/models` + `/kv_event_sources` + `/metrics`): page size, DP size and KV-event endpoints.
Why a worker is not usable yet is logged once per change of reason.
Only a healthy worker has ranks in the cache index; when it turns unhealthy its mirrors
are dropped, and they are rebuilt from a replay when it comes back (a restarted engine starts
again at seq 0 with AllBlocksCleared, so nothing stale survives).

Health: active checks (`GET /health` every interval; unhealthy after N failures, healthy after
M successes, or after the first success for a worker never seen healthy) plus a passive rule:
a refused connection while proxying marks the worker unhealthy at once, so requests stop
going to a dead worker before the next check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixserve.router.addresses import KVEndpoint, RankKey, normalize_url
from radixserve.router.circuit_breaker import CircuitBreaker
from radixserve.router.config import RouterConfig
from radixserve.router.engine_api import NotReady, probe_worker, reported_loads, split_engine_api
from radixserve.router.mirror.index import CacheIndex

logger = logging.getLogger(__name__)


@dataclass
class RankLoad:
    """Load of one (worker, dp_rank): the router's own in-flight work plus the worker's report."""

    in_flight: int = 0
    in_flight_tokens: int = 0  # uncached prompt tokens of the in-flight requests
    engine_reqs: int = 0  # running + waiting requests the engine reported at the last poll
    engine_used_tokens: int = 0
    own_at_poll: int = 0  # our in-flight count when that report came in

    @property
    def load(self) -> int:
        """Our in-flight requests now, plus what others had queued on the engine at the poll."""
        foreign = max(0, self.engine_reqs - self.own_at_poll)
        return self.in_flight + foreign


@dataclass
class Worker:
    url: str
    api_key: str | None = None
    source: str = "static"
    kv_override: tuple[KVEndpoint, ...] | None = None
    breaker: CircuitBreaker = field(default_factory=CircuitBreaker)
    healthy: bool = False
    ever_healthy: bool = False
    model_name: str | None = None
    page_size: int = 1
    dp_size: int = 1
    kv_endpoints: tuple[KVEndpoint, ...] = ()
    max_total_tokens: tuple[int, ...] = ()  # KV pool per DP rank, () when the worker says not
    storage_ids: tuple[str | None, ...] = ()  # HiCache storage per DP rank (None: none)
    loads: dict[int, RankLoad] = field(default_factory=dict)
    health_successes: int = 0
    health_failures: int = 0
    engine_api: str = "auto"  # "sglang" | "vllm" once probed (see engine_api)
    not_ready: str | None = None  # the last reason logged for not being usable yet

    def rank_keys(self) -> list[RankKey]:
        return [(self.url, rank) for rank in range(self.dp_size)]

    def available(self) -> bool:
        return self.healthy and self.breaker.allows()

    def capacity_of(self, rank: int) -> int:
        """The rank's KV pool in tokens; 0 when unknown."""
        sizes = self.max_total_tokens
        return sizes[rank] if 0 <= rank < len(sizes) else 0

    def storage_of(self, rank: int) -> str | None:
        """The rank's HiCache storage id; None without one."""
        ids = self.storage_ids
        return ids[rank] if 0 <= rank < len(ids) else None

    def load_of(self, rank: int) -> RankLoad:
        return self.loads.setdefault(rank, RankLoad())

    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}

    def describe(self) -> dict[str, Any]:
        return {
            "url": self.url,
            "source": self.source,
            "healthy": self.healthy,
            "circuit_breaker": self.breaker.state.value,
            "model": self.model_name,
            "page_size": self.page_size,
            "dp_size": self.dp_size,
            "engine_api": self.engine_api,
            "kv_events": [e.endpoint for e in self.kv_endpoints],
            "max_total_tokens": list(self.max_total_tokens),
            "load": {rank: vars(load) for rank, load in sorted(self.loads.items())},
        }


class WorkerRegistry:
    def __init__(self, config: RouterConfig, client: httpx.AsyncClient, index: CacheIndex) -> None:
        self.config = config
        self.client = client
        self.index = index
        self.workers: dict[str, Worker] = {}
        self._lock = asyncio.Lock()

    # ---- membership ---------------------------------------------------------------------------

    def add(
        self,
        url: str,
        api_key: str | None = None,
        source: str = "static",
        kv_override: Sequence[KVEndpoint] | None = None,
    ) -> Worker:
        api, url = split_engine_api(url.strip())
        url = normalize_url(url)
        if url in self.workers:
            raise ValueError(f"url: worker {url} is already registered")
        c = self.config
        breaker = CircuitBreaker(
            c.cb_failure_threshold, c.cb_success_threshold, c.cb_timeout_s,
            enabled=not c.disable_circuit_breaker,
        )  # fmt: skip
        worker = Worker(
            url,
            api_key or c.worker_api_key,
            source,
            tuple(kv_override) if kv_override is not None else None,
            breaker,
        )
        worker.engine_api = api or c.engine_api
        self.workers[url] = worker
        logger.info("worker added url=%s source=%s", url, source)
        return worker

    async def remove(self, url: str) -> Worker:
        worker = self.workers.pop(normalize_url(url), None)
        if worker is None:
            raise KeyError(url)
        await self._drop_ranks(worker)
        logger.info("worker removed url=%s", worker.url)
        return worker

    def available(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.available()]

    def find(self, url: str) -> Worker | None:
        return self.workers.get(url)

    # ---- health -------------------------------------------------------------------------------

    async def probe(self, worker: Worker) -> None:
        """Ask the worker what it is (engine_api); raises NotReady naming what is missing."""
        info = await probe_worker(lambda path: self._get(worker, path), worker.engine_api)
        worker.engine_api = info.api
        worker.page_size, worker.dp_size, worker.model_name = (
            info.page_size, info.dp_size, info.model_name
        )  # fmt: skip
        worker.max_total_tokens = info.max_total_tokens
        worker.storage_ids = info.storage_ids
        found = info.kv_endpoints
        worker.kv_endpoints = worker.kv_override if worker.kv_override is not None else found

    def _not_ready(self, worker: Worker, reason: str) -> None:
        """Log why the worker is not usable yet, once per change of reason."""
        if reason != worker.not_ready:
            worker.not_ready = reason
            logger.warning("worker not ready url=%s reason=%s", worker.url, reason)

    async def _get(self, worker: Worker, path: str) -> httpx.Response:
        timeout = self.config.health_check_timeout_s
        return await self.client.get(worker.url + path, headers=worker.headers(), timeout=timeout)

    async def check(self, worker: Worker) -> None:
        """One active health check, with the thresholds of the config."""
        try:
            status = (await self._get(worker, "/health")).status_code
            ok, why = status == 200, f"/health answered {status}"
        except httpx.HTTPError as exc:
            ok, why = False, f"/health: {type(exc).__name__}"
        if not ok and not worker.healthy:
            self._not_ready(worker, why)
        if ok:
            worker.health_failures = 0
            worker.health_successes += 1
            enough = worker.health_successes >= self.config.health_success_threshold
            if not worker.healthy and (enough or not worker.ever_healthy):
                await self.mark_healthy(worker)
        else:
            worker.health_successes = 0
            worker.health_failures += 1
            if worker.healthy and worker.health_failures >= self.config.health_failure_threshold:
                await self.mark_unhealthy(worker, "health check failed")

    async def mark_healthy(self, worker: Worker) -> None:
        async with self._lock:
            if worker.healthy or self.workers.get(worker.url) is not worker:
                return
            try:
                await self.probe(worker)
            except (NotReady, ValueError, KeyError, TypeError) as exc:
                self._not_ready(worker, str(exc) or type(exc).__name__)
                return
            by_rank = {e.dp_rank: e for e in worker.kv_endpoints}
            for key in worker.rank_keys():
                self.index.add_rank(
                    key,
                    worker.page_size,
                    by_rank.get(key[1]),
                    worker.capacity_of(key[1]),
                    worker.storage_of(key[1]),
                )
            # Route only once the mirrors hold what the worker caches now (a router that
            # restarts beside warm workers); bounded, as a replay that never answers is one.
            wait = self.index.replay_timeout_s + 1
            if not await self.index.wait_synced(worker.rank_keys(), wait):
                logger.warning("worker %s: KV-event replay not done after %.0fs", worker.url, wait)
            worker.healthy = worker.ever_healthy = True
            worker.not_ready = None
            worker.breaker.reset()
            logger.info(
                "worker healthy url=%s engine_api=%s dp_size=%d page_size=%d kv_events=%s",
                worker.url, worker.engine_api, worker.dp_size, worker.page_size, bool(by_rank),
            )  # fmt: skip

    async def mark_unhealthy(self, worker: Worker, reason: str) -> None:
        async with self._lock:
            if not worker.healthy:
                return
            worker.healthy = False
            worker.health_successes = 0
            await self._drop_ranks(worker)
            logger.warning("worker unhealthy url=%s reason=%s", worker.url, reason)

    async def _drop_ranks(self, worker: Worker) -> None:
        for key in worker.rank_keys():
            await self.index.remove_rank(key)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in list(self.workers.values())))

    async def health_loop(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.config.health_check_interval_s)

    # ---- load ---------------------------------------------------------------------------------

    async def poll_load(self, worker: Worker) -> None:
        """The engine's own queue (SGLang `/get_load`, vLLM `/metrics`), per DP rank."""
        for entry in await reported_loads(lambda path: self._get(worker, path), worker.engine_api):
            load = worker.load_of(entry.dp_rank)
            load.engine_reqs = entry.num_reqs
            load.engine_used_tokens = entry.num_used_tokens
            load.own_at_poll = load.in_flight

    async def load_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.poll_load(w) for w in self.available()))
            await asyncio.sleep(self.config.load_check_interval_s)
