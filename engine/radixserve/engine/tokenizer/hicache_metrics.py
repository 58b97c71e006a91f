"""HiCache's series on /metrics (only for DP ranks whose load carries HiCache counters): hits
per tier, load-back volume and time, backups, drops, and the levels of the host pool and the
storage writer, read from each DP rank's LoadOutput at scrape time (the cache counts; this
only renders). Names follow SGLang's where it has one (load_back_tokens, backuped_tokens)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, Metric

from radixserve.engine.tokenizer.load_collector import LABELS, LoadPartCollector, P

# (metric name without _total, HiCacheLoad field, help)
COUNTERS = (
    ("load_back_tokens", "load_back_tokens", "Tokens copied from the host tier to the KV pool"),
    ("load_back_bytes", "load_back_bytes", "Bytes copied from the host tier to the KV pool"),
    ("load_back_duration_seconds", "load_back_seconds", "Time spent copying them"),
    ("backuped_tokens", "backup_tokens", "Tokens copied from the KV pool to the host tier"),
    ("hicache_dropped_tokens", "dropped_tokens", "Evicted tokens that no tier kept"),
    ("prefetched_tokens", "prefetched_tokens", "Tokens read from storage for waiting requests"),
    (
        "storage_prefetch_deferrals",
        "prefetch_deferrals",
        "Admission rounds a request skipped while its storage read was unfinished",
    ),
    (
        "storage_prefetch_lost_tokens",
        "prefetch_lost_tokens",
        "Tokens read from storage, then dropped: the prefix they follow was evicted meanwhile",
    ),
)
GAUGES = (
    ("hicache_host_used_tokens", "host_used_tokens", "Tokens held by the host tier"),
    ("hicache_host_total_tokens", "host_total_tokens", "Size of the host tier in tokens"),
    ("hicache_storage_write_queue_depth", "storage_pending_writes", "Pages queued for storage"),
    ("hicache_storage_used_bytes", "storage_used_bytes", "Bytes this replica sees in storage"),
    ("hicache_prefetch_staged_bytes", "prefetch_staged_bytes", "Bytes read, not yet admitted"),
)
TIERS = (
    ("device", "device_hit_tokens"),
    ("host", "host_hit_tokens"),
    ("storage", "storage_hit_tokens"),
)


class HiCacheCollector(LoadPartCollector):
    """HiCache's counters and levels, plus its hits by tier."""

    part, counters, gauges = "hicache", COUNTERS, GAUGES

    def extra(self, ranks: list[tuple[list[str], Any]]) -> Iterator[Metric]:
        hits = CounterMetricFamily(
            P + "hicache_hit_tokens", "Prefix tokens matched, by the tier that held them",
            labels=[*LABELS, "tier"],
        )  # fmt: skip
        for values, hc in ranks:
            for tier, field in TIERS:
                hits.add_metric([*values, tier], getattr(hc, field))
        yield hits
