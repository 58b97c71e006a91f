"""Prometheus metrics of one replica, under SGLang's names with the `radixserve:` prefix.

Counters and latency histograms are fed by the tokenizer manager as outputs arrive, labelled
with the DP rank that served the request; gauges (running / queued requests, token usage) are
refreshed from the scheduler's load at scrape time, one series per DP rank. Every series but
the server-wide cache hit rate and generation throughput carries `dp_rank` ("0" with one DP
rank). Each server owns its own CollectorRegistry: no process-global metric state.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from radixserve.engine.ipc.messages import LoadOutput
from radixserve.engine.tokenizer.expert_metrics import ExpertCollector
from radixserve.engine.tokenizer.hicache_metrics import HiCacheCollector
from radixserve.engine.tokenizer.pd_metrics import PDCollector
from radixserve.engine.tokenizer.spec_metrics import SpecCollector

P = "radixserve:"
LATENCY_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
ITL_BUCKETS = (0.002, 0.005, 0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56)
THROUGHPUT_WINDOW_S = 10.0


@dataclass(frozen=True, slots=True)
class FinishedCounts:
    """What the metrics take from a finished request."""

    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    total_retractions: int
    is_abort: bool
    e2e_latency: float


class EngineMetrics:
    def __init__(self, model_name: str, disaggregation: bool = False) -> None:
        self.registry = reg = CollectorRegistry()
        # a prefill or decode server: its queues and transfers (tokenizer/pd_metrics.py)
        self.pd = PDCollector(model_name) if disaggregation else None
        if self.pd is not None:
            reg.register(self.pd)
        self.hicache = HiCacheCollector(model_name)  # silent unless a rank runs HiCache
        reg.register(self.hicache)
        self.experts = ExpertCollector(model_name)  # silent without the recorder or EPLB
        reg.register(self.experts)
        self.spec = SpecCollector(model_name)  # silent without speculative decoding
        reg.register(self.spec)
        labels = ["model_name"]
        self.labels = {"model_name": model_name}

        def g(name: str, doc: str) -> Gauge:
            return Gauge(P + name, doc, labels, registry=reg)

        ranked = [*labels, "dp_rank"]

        def rank_g(name: str, doc: str) -> Gauge:
            return Gauge(P + name, doc, ranked, registry=reg)

        def c(name: str, doc: str) -> Counter:
            return Counter(P + name, doc, ranked, registry=reg)

        def h(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(P + name, doc, ranked, buckets=buckets, registry=reg)

        self.num_running_reqs = rank_g("num_running_reqs", "Requests running on the scheduler")
        self.num_queue_reqs = rank_g("num_queue_reqs", "Requests waiting in the scheduler queue")
        self.token_usage = rank_g("token_usage", "Fraction of the KV pool in use")
        self.num_used_tokens = rank_g("num_used_tokens", "KV tokens in use")
        self.cache_hit_rate = g("cache_hit_rate", "Cached prompt tokens / prompt tokens")
        self.gen_throughput = g("gen_throughput", "Generated tokens per second (10 s window)")
        self.prompt_tokens = c("prompt_tokens", "Prompt tokens of finished requests")
        self.generation_tokens = c("generation_tokens", "Generated tokens of finished requests")
        self.cached_tokens = c("cached_tokens", "Prompt tokens served from the prefix cache")
        self.num_requests = c("num_requests", "Finished requests")
        self.num_aborted = c("num_aborted_requests", "Requests finished by an abort")
        self.num_retractions = c("num_retractions", "Retractions of finished requests")
        self.ttft = h("time_to_first_token_seconds", "Time to first token", LATENCY_BUCKETS)
        self.itl = h("inter_token_latency_seconds", "Inter-token latency", ITL_BUCKETS)
        self.e2e = h("e2e_request_latency_seconds", "End-to-end latency", LATENCY_BUCKETS)
        self.queue_time = h(
            "queue_time_seconds",
            "Time from arrival at the scheduler to the first prefill (SGLang's queue_time)",
            LATENCY_BUCKETS,
        )
        self._recent: deque[tuple[float, int]] = deque()
        self._prompt_total = 0
        self._cached_total = 0

    def _rank(self, dp_rank: int) -> dict[str, str]:
        return {**self.labels, "dp_rank": str(dp_rank)}

    def observe_ttft(self, seconds: float, dp_rank: int = 0) -> None:
        self.ttft.labels(**self._rank(dp_rank)).observe(seconds)

    def observe_queue_time(self, seconds: float, dp_rank: int = 0) -> None:
        self.queue_time.labels(**self._rank(dp_rank)).observe(seconds)

    def observe_itl(self, seconds: float, dp_rank: int = 0) -> None:
        self.itl.labels(**self._rank(dp_rank)).observe(seconds)

    def observe_tokens(self, n: int) -> None:
        self._recent.append((time.monotonic(), n))

    def observe_client_abort(self, dp_rank: int = 0) -> None:
        """A client went away before its request finished; the request was aborted."""
        self.num_aborted.labels(**self._rank(dp_rank)).inc()

    def observe_finished(self, done: FinishedCounts, dp_rank: int = 0) -> None:
        lab = self._rank(dp_rank)
        self.prompt_tokens.labels(**lab).inc(done.prompt_tokens)
        self.generation_tokens.labels(**lab).inc(done.completion_tokens)
        self.cached_tokens.labels(**lab).inc(done.cached_tokens)
        self.num_requests.labels(**lab).inc()
        self.num_retractions.labels(**lab).inc(done.total_retractions)
        if done.is_abort:
            self.num_aborted.labels(**lab).inc()
        self.e2e.labels(**lab).observe(done.e2e_latency)
        self._prompt_total += done.prompt_tokens
        self._cached_total += done.cached_tokens

    def render(self, loads: list[LoadOutput]) -> bytes:
        """Refresh gauges from each DP rank's LoadOutput and render the exposition text."""
        lab = self.labels
        if self.pd is not None:
            self.pd.loads = loads
        self.hicache.loads = loads
        self.experts.loads = loads
        self.spec.loads = loads
        for load in loads:
            rank = self._rank(load.dp_rank)
            self.num_running_reqs.labels(**rank).set(load.num_running_reqs)
            self.num_queue_reqs.labels(**rank).set(load.num_waiting_reqs)
            self.token_usage.labels(**rank).set(load.token_usage)
            self.num_used_tokens.labels(**rank).set(load.token_usage * load.max_total_num_tokens)
        self.cache_hit_rate.labels(**lab).set(self._cached_total / max(self._prompt_total, 1))
        now = time.monotonic()
        while self._recent and now - self._recent[0][0] > THROUGHPUT_WINDOW_S:
            self._recent.popleft()
        self.gen_throughput.labels(**lab).set(sum(n for _, n in self._recent) / THROUGHPUT_WINDOW_S)
        return generate_latest(self.registry)
