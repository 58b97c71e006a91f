"""The metric-name extractor the dashboard test relies on, on expressions with known answers."""

from __future__ import annotations

import pytest

from tests.observability.promql import dashboard_queries, metric_names


@pytest.mark.parametrize(
    ("expr", "names"),
    [
        ("radixserve:num_running_reqs", {"radixserve:num_running_reqs"}),
        (
            'histogram_quantile(0.99, sum by (le) (rate(rs:e2e_bucket{ns=~"$ns"}[$__interval])))',
            {"rs:e2e_bucket"},
        ),
        (
            "sum by (pod) (rate(a_total[5m])) / sum by (pod) (rate(b_total[5m]))",
            {"a_total", "b_total"},
        ),
        ('max by (worker) (router_open{job="x", le="0.5"})', {"router_open"}),
        ("sum(x) without (instance) + on (pod) group_left y > bool 2", {"x", "y"}),
        ("rate(x[5m] offset 1h) * 1e3", {"x"}),
        ('label_values(rs:running{namespace=~"$namespace"}, inferenceservice)', {"rs:running"}),
        ("max_over_time(up[1h:5m])", {"up"}),
    ],
)
def test_metric_names(expr: str, names: set[str]) -> None:
    assert metric_names(expr) == names


def test_dashboard_queries_walk_panels_rows_and_variables() -> None:
    dashboard = {
        "panels": [
            {"type": "row", "panels": [{"targets": [{"expr": "a"}]}]},
            {"targets": [{"expr": "b"}, {"expr": "c"}]},
        ],
        "templating": {"list": [{"type": "query", "query": {"query": "label_values(d, x)"}}]},
    }
    assert dashboard_queries(dashboard) == ["a", "b", "c", "label_values(d, x)"]
