"""The router's view of its engine replicas: registration, health, load, circuit breakers.

A worker is added by URL (static list, admin API or Kubernetes discovery) and stays *pending*
until its `/server_info` answers: that gives its page size, DP size and KV-event endpoints.
Only a healthy worker has targets in the cache index; when it turns unhealthy its mirrors
are dropped, and they are rebuilt from a replay when it comes back (a restarted engine starts
again at seq 0 with AllBlocksCleared, so nothing stale survives).

Health: active checks (`GET /health` every interval; unhealthy after N failures, healthy after
M successes, or after the first success for a worker never seen healthy) plus a passive rule:
a refused connection while proxying marks the worker unhealthy at once, so requests stop
going to a dead replica before the next check.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from radixserve.router.circuit_breaker import CircuitBreaker
from radixserve.router.config import RouterConfig
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.targets import KVEndpoint, TargetKey, normalize_url

logger = logging.getLogger(__name__)


@dataclass
class TargetLoad:
    """Load of one (worker, dp_rank): the router's own in-flight work plus the engine's report."""

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
    loads: dict[int, TargetLoad] = field(default_factory=dict)
    health_successes: int = 0
    health_failures: int = 0

    def targets(self) -> list[TargetKey]:
        return [(self.url, rank) for rank in range(self.dp_size)]

    def available(self) -> bool:
        return self.healthy and self.breaker.allows()

    def load_of(self, rank: int) -> TargetLoad:
        return self.loads.setdefault(rank, TargetLoad())

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
            "kv_events": [e.endpoint for e in self.kv_endpoints],
            "load": {rank: vars(load) for rank, load in sorted(self.loads.items())},
        }


def parse_kv_endpoints(info: dict[str, Any]) -> tuple[KVEndpoint, ...]:
    out = []
    for entry in info.get("kv_events") or ():
        replay = entry.get("replay_endpoint")
        out.append(
            KVEndpoint(
                dp_rank=int(entry.get("dp_rank", 0)),
                endpoint=entry["endpoint"],  # 0.0.0.0 → the worker's host: CacheIndex does it
                replay_endpoint=replay,
                topic=entry.get("topic", ""),
            )
        )
    return tuple(out)


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
        self.workers[url] = worker
        logger.info("worker added url=%s source=%s", url, source)
        return worker

    async def remove(self, url: str) -> Worker:
        worker = self.workers.pop(normalize_url(url), None)
        if worker is None:
            raise KeyError(url)
        await self._drop_targets(worker)
        logger.info("worker removed url=%s", worker.url)
        return worker

    def available(self) -> list[Worker]:
        return [w for w in self.workers.values() if w.available()]

    def find(self, url: str) -> Worker | None:
        return self.workers.get(url)

    # ---- health -------------------------------------------------------------------------------

    async def probe(self, worker: Worker) -> None:
        """Fetch `/server_info` and `/model_info`; raises httpx errors or ValueError."""
        info = await self._get_json(worker, "/server_info")
        model = await self._get_json(worker, "/model_info")
        worker.page_size = int(info.get("page_size") or 1)
        worker.dp_size = max(1, int(info.get("dp_size") or 1))
        worker.model_name = model.get("served_model_name") or info.get("served_model_name")
        found = parse_kv_endpoints(info)
        worker.kv_endpoints = worker.kv_override if worker.kv_override is not None else found

    async def _get(self, worker: Worker, path: str) -> httpx.Response:
        timeout = self.config.health_check_timeout_s
        return await self.client.get(worker.url + path, headers=worker.headers(), timeout=timeout)

    async def _get_json(self, worker: Worker, path: str) -> dict[str, Any]:
        resp = await self._get(worker, path)
        resp.raise_for_status()
        body = resp.json()
        if not isinstance(body, dict):
            raise ValueError(f"{path}: expected a JSON object")
        return body

    async def check(self, worker: Worker) -> None:
        """One active health check, with the thresholds of the config."""
        try:
            ok = (await self._get(worker, "/health")).status_code == 200
        except httpx.HTTPError:
            ok = False
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
            except (httpx.HTTPError, ValueError, KeyError) as exc:
                logger.info("worker not ready url=%s error=%r", worker.url, exc)
                return
            by_rank = {e.dp_rank: e for e in worker.kv_endpoints}
            for key in worker.targets():
                self.index.add_target(key, worker.page_size, by_rank.get(key[1]))
            worker.healthy = worker.ever_healthy = True
            worker.breaker.reset()
            logger.info(
                "worker healthy url=%s dp_size=%d page_size=%d kv_events=%s",
                worker.url, worker.dp_size, worker.page_size, bool(by_rank),
            )  # fmt: skip

    async def mark_unhealthy(self, worker: Worker, reason: str) -> None:
        async with self._lock:
            if not worker.healthy:
                return
            worker.healthy = False
            worker.health_successes = 0
            await self._drop_targets(worker)
            logger.warning("worker unhealthy url=%s reason=%s", worker.url, reason)

    async def _drop_targets(self, worker: Worker) -> None:
        for key in worker.targets():
            await self.index.remove_target(key)

    async def check_all(self) -> None:
        await asyncio.gather(*(self.check(w) for w in list(self.workers.values())))

    async def health_loop(self) -> None:
        while True:
            await self.check_all()
            await asyncio.sleep(self.config.health_check_interval_s)

    # ---- load ---------------------------------------------------------------------------------

    async def poll_load(self, worker: Worker) -> None:
        try:
            resp = await self._get(worker, "/get_load")
            resp.raise_for_status()
            body = resp.json()
        except (httpx.HTTPError, ValueError):
            return  # the health checks decide what an unreachable worker means
        for entry in body if isinstance(body, list) else [body]:
            load = worker.load_of(int(entry.get("dp_rank") or 0))
            load.engine_reqs = int(entry.get("num_reqs") or 0)
            load.engine_used_tokens = int(entry.get("num_used_tokens") or 0)
            load.own_at_poll = load.in_flight

    async def load_loop(self) -> None:
        while True:
            await asyncio.gather(*(self.poll_load(w) for w in self.available()))
            await asyncio.sleep(self.config.load_check_interval_s)
