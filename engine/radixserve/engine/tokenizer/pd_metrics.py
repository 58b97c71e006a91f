"""Prefill/decode disaggregation's series on /metrics (only on a prefill or decode server):
SGLang's queue gauges and failure counters, and the transfer counters, read from each DP
rank's LoadOutput at scrape time (the scheduler counts; this only renders)."""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from radixserve.engine.ipc.messages import LoadOutput

P = "radixserve:"
GAUGES = (
    ("num_prefill_bootstrap_queue_reqs", "Prefill: requests waiting for their decode's KVRequest"),
    ("num_prefill_inflight_queue_reqs", "Prefill: requests whose KV is being sent or acknowledged"),
    (
        "num_decode_prealloc_queue_reqs",
        "Decode: requests waiting for their prefill's topology or memory",
    ),
    ("num_decode_transfer_queue_reqs", "Decode: requests waiting for their KV"),
)
# (metric name without _total, LoadOutput field, help)
COUNTERS = (
    (
        "kv_transfer_pages",
        "kv_transfer_pages_total",
        "KV pages written (prefill) or received (decode)",
    ),
    (
        "kv_transfer_bytes",
        "kv_transfer_bytes_total",
        "KV bytes written (prefill) or received (decode)",
    ),
    (
        "kv_transfer_seconds",
        "kv_transfer_seconds_total",
        "Prefill: seconds inside the transfer engine",
    ),
    ("kv_transfers", "kv_transfers_total", "Requests whose KV moved completely"),
    ("num_transfer_failed_reqs", "kv_transfer_failed_total", "Requests whose KV transfer failed"),
    (
        "num_bootstrap_failed_reqs",
        "bootstrap_failed_total",
        "Requests refused or lost at bootstrap",
    ),
)


class PDCollector:
    """A prometheus_client collector over the latest loads (set before each scrape)."""

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.loads: list[LoadOutput] = []

    def collect(self) -> Iterator[Metric]:
        labels = ["model_name", "dp_rank"]
        for name, doc in GAUGES:
            gauge = GaugeMetricFamily(P + name, doc, labels=labels)
            for load in self.loads:
                gauge.add_metric([self.model_name, str(load.dp_rank)], getattr(load, name))
            yield gauge
        for name, field, doc in COUNTERS:
            counter = CounterMetricFamily(P + name, doc, labels=labels)
            for load in self.loads:
                counter.add_metric([self.model_name, str(load.dp_rank)], getattr(load, field))
            yield counter
