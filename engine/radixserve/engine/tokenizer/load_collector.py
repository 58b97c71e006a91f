"""A prometheus_client collector of one optional part of each DP rank's LoadOutput (HiCache's
counters, the experts' balance): a counter and a gauge family per listed field, labelled by
model and DP rank, rendered from the loads set before each scrape, and silent while no rank
carries that part."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from radixserve.engine.ipc.messages import LoadOutput

P = "radixserve:"
LABELS = ["model_name", "dp_rank"]
Series = tuple[tuple[str, str, str], ...]  # (metric name without _total, field, help)


class LoadPartCollector:
    part = ""  # the LoadOutput field this collector renders
    counters: Series = ()
    gauges: Series = ()

    def __init__(self, model_name: str) -> None:
        self.model_name = model_name
        self.loads: list[LoadOutput] = []

    def ranks(self) -> list[tuple[list[str], Any]]:
        """(label values, the part) of every rank that carries it."""
        parts = [(load.dp_rank, getattr(load, self.part)) for load in self.loads]
        return [([self.model_name, str(r)], p) for r, p in parts if p is not None]

    def extra(self, ranks: list[tuple[list[str], Any]]) -> Iterator[Metric]:
        """Families beyond one value per field (none by default)."""
        return iter(())

    def collect(self) -> Iterator[Metric]:
        ranks = self.ranks()
        if not ranks:
            return
        yield from self.extra(ranks)
        for family, series in ((CounterMetricFamily, self.counters),
                               (GaugeMetricFamily, self.gauges)):  # fmt: skip
            for name, field, doc in series:
                metric = family(P + name, doc, labels=LABELS)
                for values, part in ranks:
                    metric.add_metric(values, getattr(part, field))
                yield metric
