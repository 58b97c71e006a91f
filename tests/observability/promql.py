"""Metric names out of PromQL expressions and Grafana dashboards, for the dashboard tests.

Not a PromQL parser: it removes what cannot be a metric name (label matchers, range and
subquery brackets, grouping label lists, strings, Grafana variables, numbers), then keeps the
identifiers that are not function calls or keywords. `tests/observability/test_promql.py` pins
it on expressions with known answers.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

_MATCHERS = re.compile(r"\{[^{}]*\}")
_RANGES = re.compile(r"\[[^\[\]]*\]")
_GROUPING = re.compile(
    r"\b(by|without|on|ignoring|group_left|group_right)\s*\([^()]*\)", re.IGNORECASE
)
_STRINGS = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')
_VARIABLES = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
_IDENT = re.compile(r"(?<![A-Za-z0-9_:.])([A-Za-z_:][A-Za-z0-9_:]*)(\s*\()?")
_KEYWORDS = frozenset(
    {"and", "or", "unless", "by", "without", "on", "ignoring", "group_left", "group_right",
     "offset", "bool", "inf", "nan", "atan2"}
)  # fmt: skip
_LABEL_VALUES = re.compile(r"^\s*label_values\((.*),\s*[A-Za-z_][A-Za-z0-9_]*\s*\)\s*$", re.S)


def metric_names(expr: str) -> set[str]:
    """The metric (sample) names an expression selects."""
    grafana = _LABEL_VALUES.match(expr)
    if grafana:  # Grafana's label_values(<selector>, <label>): the label is no metric
        expr = grafana.group(1)
    text = _STRINGS.sub("", expr)
    text = _MATCHERS.sub("", text)
    text = _RANGES.sub("", text)
    text = _VARIABLES.sub("", text)
    text = _GROUPING.sub("", text)
    names = set()
    for match in _IDENT.finditer(text):
        name, call = match.group(1), match.group(2)
        if call or name.lower() in _KEYWORDS:
            continue
        names.add(name)
    return names


def _walk(node: Any) -> Iterator[dict[str, Any]]:
    if isinstance(node, dict):
        yield node
        for value in node.values():
            yield from _walk(value)
    elif isinstance(node, list):
        for item in node:
            yield from _walk(item)


def dashboard_queries(dashboard: dict[str, Any]) -> list[str]:
    """Every PromQL expression of a dashboard: panel targets and template-variable queries."""
    queries = [t["expr"] for t in _walk(dashboard.get("panels", [])) if "expr" in t]
    for var in dashboard.get("templating", {}).get("list", []):
        if var.get("type") == "query":
            query = var["query"]
            queries.append(query["query"] if isinstance(query, dict) else query)
    return queries
