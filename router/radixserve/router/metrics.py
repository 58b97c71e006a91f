"""Prometheus metrics of the router (`radixserve_router_*`), on its own registry.

Counters are updated on the request path; gauges that describe state (worker health, load,
mirror sizes) are read at scrape time from the registry and the cache index, so they can
never drift from what the router actually holds.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from radixserve.router.mirror.index import CacheIndex
from radixserve.router.workers import WorkerRegistry

DECISION_BUCKETS = (1e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 5e-2, 0.1)


class _StateCollector(Collector):
    def __init__(self, workers: WorkerRegistry, index: CacheIndex) -> None:
        self.workers = workers
        self.index = index

    def collect(self) -> Iterator[Any]:
        healthy = GaugeMetricFamily(
            "radixserve_router_worker_healthy", "1 if the worker is healthy", labels=["worker"]
        )
        breaker = GaugeMetricFamily(
            "radixserve_router_circuit_open", "1 if the worker's breaker is open", labels=["worker"]
        )
        load = GaugeMetricFamily(
            "radixserve_router_worker_load",
            "in-flight requests (ours + the engine's others)",
            labels=["worker", "dp_rank"],
        )
        for w in list(self.workers.workers.values()):
            healthy.add_metric([w.url], float(w.healthy))
            breaker.add_metric([w.url], float(not w.breaker.allows()))
            for rank, tl in sorted(w.loads.items()):
                load.add_metric([w.url, str(rank)], float(tl.load))
        tokens = GaugeMetricFamily(
            "radixserve_router_mirror_tokens",
            "tokens held by the router's view of a rank's cache",
            labels=["worker", "dp_rank", "mode"],
        )
        for (url, rank), st in sorted(self.index.stats().items()):
            tokens.add_metric([url, str(rank), st.mode], float(st.num_tokens))
        yield from (healthy, breaker, load, tokens)


class RouterMetrics:
    def __init__(self, workers: WorkerRegistry, index: CacheIndex) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter(
            "radixserve_router_requests",
            "requests routed, by worker, route and outcome",
            ["worker", "route", "outcome"],
            registry=r,
        )
        self.prompt_tokens = Counter(
            "radixserve_router_prompt_tokens", "prompt tokens routed", ["worker"], registry=r
        )
        self.cached_tokens = Counter(
            "radixserve_router_cached_tokens",
            "prompt tokens found cached on the chosen rank at routing time",
            ["worker"],
            registry=r,
        )
        self.retries = Counter(
            "radixserve_router_retries", "attempts retried on another worker", registry=r
        )
        self.decision = Histogram(
            "radixserve_router_decision_seconds",
            "time to choose a rank (views, prefix match, policy)",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        self.tokenize = Histogram(
            "radixserve_router_tokenize_seconds",
            "time to tokenize a request for routing",
            buckets=DECISION_BUCKETS,
            registry=r,
        )
        r.register(_StateCollector(workers, index))
        # labelled children by their labels: `labels()` validates and locks on every call
        # (~1.5 µs), three times per request; children are never removed, so they stay valid
        self._children: dict[tuple[Any, ...], Any] = {}

    def _child(self, metric: Counter, *labels: str) -> Any:
        key = (metric, *labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def count_request(self, worker: str, route: str, outcome: str) -> None:
        self._child(self.requests, worker, route, outcome).inc()

    def count_routed(self, worker: str, prompt_tokens: int, cached_tokens: int) -> None:
        self._child(self.prompt_tokens, worker).inc(prompt_tokens)
        self._child(self.cached_tokens, worker).inc(cached_tokens)

    def render(self) -> bytes:
        return generate_latest(self.registry)
