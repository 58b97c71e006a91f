"""Every metric the dashboard, the HPA and the KEDA example name is exported by our live
processes: a real SmolLM2 engine (`radixserve serve`) and a real router in front of it, after a
few requests, scraped over HTTP (the `live` fixture in conftest.py, shared with the log tests).

A name counts as exported when it is a sample name of the scrape (so `_bucket` / `_sum` /
`_count` of a histogram and `_total` of a counter map to their family, as in PromQL).
"""

from __future__ import annotations

import json
import re

import pytest
import yaml

from radixserve.operator.autoscaling import METRICS
from tests.deploy.render import CHART, REPO
from tests.observability.live_run import Scrape
from tests.observability.promql import dashboard_queries, metric_names

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

DASHBOARD = CHART / "dashboards" / "radixserve.json"
KEDA = REPO / "manifests" / "examples" / "keda-scaledobject.yaml"


def test_the_scrape_holds_what_the_requests_produced(scrape: Scrape) -> None:
    """Sanity of the oracle: real traffic shows up, and under the families we expect."""
    assert scrape.engine["radixserve:num_requests_total"] == ("radixserve:num_requests", "counter")
    ttft = scrape.engine["radixserve:time_to_first_token_seconds_bucket"]
    assert ttft == ("radixserve:time_to_first_token_seconds", "histogram")
    queue = scrape.engine["radixserve:queue_time_seconds_bucket"]
    assert queue == ("radixserve:queue_time_seconds", "histogram")
    assert scrape.router["radixserve_router_requests_total"][1] == "counter"
    assert not set(scrape.engine) & set(scrape.router)


def test_every_dashboard_expression_names_only_exported_metrics(scrape: Scrape) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = dashboard_queries(dashboard)
    assert len(queries) >= 25
    named: dict[str, set[str]] = {}
    for query in queries:
        names = metric_names(query)
        assert names, f"no metric found in {query!r}"
        for name in names:
            named.setdefault(name, set()).add(query)
    missing = {name: sorted(q)[0] for name, q in named.items() if name not in scrape.all}
    assert not missing, f"not exported by the live engine or router: {missing}"
    families = {scrape.all[name][0] for name in named}
    # every family the issue asks for is on the dashboard
    for wanted in (
        "radixserve:generation_tokens", "radixserve:time_to_first_token_seconds",
        "radixserve:inter_token_latency_seconds", "radixserve:e2e_request_latency_seconds",
        "radixserve:queue_time_seconds",
        "radixserve:num_running_reqs", "radixserve:num_queue_reqs", "radixserve:token_usage",
        "radixserve:cached_tokens", "radixserve_router_requests",
        "radixserve_router_cached_tokens", "radixserve_router_retries",
        "radixserve_router_circuit_open", "radixserve_router_worker_load",
    ):  # fmt: skip
        assert wanted in families, f"the dashboard shows nothing of {wanted}"


def test_histogram_panels_read_histograms(scrape: Scrape) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    for query in dashboard_queries(dashboard):
        if "histogram_quantile" in query:
            for name in metric_names(query):
                assert name.endswith("_bucket") and scrape.all[name][1] == "histogram", query


def test_autoscaling_metrics_come_from_exported_engine_series(scrape: Scrape) -> None:
    for key, metric in METRICS.items():
        for series in metric.series:
            assert scrape.engine.get(series, ("", ""))[1] == "gauge", f"{key}: {series}"
    (trigger,) = yaml.safe_load(KEDA.read_text())["spec"]["triggers"]
    for name in metric_names(trigger["metadata"]["query"]):
        assert name in scrape.engine, f"the KEDA example reads {name}, which no engine exports"


def test_a_made_up_name_would_be_caught(scrape: Scrape) -> None:
    """The check bites: a misspelt metric is not in the scrape."""
    names = metric_names("sum(rate(radixserve:generation_token_total[5m]))")
    assert names and not names <= set(scrape.all)
    assert re.fullmatch(r"radixserve:[a-z_]+", next(iter(names)))
