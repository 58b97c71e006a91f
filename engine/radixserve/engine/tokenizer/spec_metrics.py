"""Speculative decoding on /metrics (only for DP ranks that speculate): how many tokens a verify
emits per request (its mean, SGLang's `spec_accept_length`, and its histogram), drafts proposed
and accepted, and the time spent drafting and verifying (÷ verify steps: per step). Read from
each DP rank's LoadOutput at scrape time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client.core import HistogramMetricFamily, Metric

from radixserve.engine.tokenizer.load_collector import LABELS, LoadPartCollector, P

GAUGES = (
    ("spec_accept_length", "accept_length",
     "Mean tokens one verify emits per request (accepted drafts + 1) since start"),
)  # fmt: skip
COUNTERS = (
    ("spec_verify_steps", "verify_steps", "Forward steps that verified draft tokens"),
    ("spec_verified_requests", "verified_reqs", "Request-steps verified with drafts"),
    ("spec_proposed_drafts", "proposed_drafts", "Draft tokens proposed"),
    ("spec_accepted_drafts", "accepted_drafts", "Draft tokens accepted"),
    ("spec_draft_seconds", "draft_seconds", "Time spent looking drafts up"),
    ("spec_verify_seconds", "verify_seconds", "Time spent in verify steps (forward and accept)"),
)


class SpecCollector(LoadPartCollector):
    part, counters, gauges = "spec", COUNTERS, GAUGES

    def extra(self, ranks: list[tuple[list[str], Any]]) -> Iterator[Metric]:
        hist = HistogramMetricFamily(
            P + "spec_accept_length_per_request",
            "Tokens one verify emitted per request (accepted drafts + 1)",
            labels=LABELS,
        )
        for values, part in ranks:
            counts: list[int] = part.accept_length_counts
            buckets, total = [], 0
            for n, c in enumerate(counts[1:], start=1):
                total += c
                buckets.append((str(float(n)), total))
            buckets.append(("+Inf", total))
            emitted = sum(n * c for n, c in enumerate(counts))
            hist.add_metric(values, buckets, float(emitted))
        yield hist
