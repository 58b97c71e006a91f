"""Small closed schemas for the third-party custom resources we ship: KEDA's ScaledObject and the
Prometheus Operator's ServiceMonitor / PodMonitor (monitoring.coreos.com/v1).

kubernetes-validate bundles only built-in kinds, and the upstream CRDs are not ours to vendor,
so these schemas hold the subset of each upstream CRD (field names and types as in
kedacore/keda `keda.sh_scaledobjects.yaml` and prometheus-operator
`monitoring.coreos.com_{servicemonitors,podmonitors}.yaml`) that our objects use. They are
closed (unknown fields are errors), so a misspelled field fails here as it would under strict
field validation on a cluster with those CRDs.
"""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

_STR = {"type": "string"}
_INT = {"type": "integer"}
_STR_MAP = {"type": "object", "additionalProperties": _STR}


def _obj(required: tuple[str, ...] = (), **props: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    return out


_META = {"type": "object", "required": ["name"], "properties": {"name": _STR}}
_SELECTOR = _obj(
    matchLabels=_STR_MAP,
    matchExpressions={
        "type": "array",
        "items": _obj(("key", "operator"), key=_STR, operator=_STR, values={"type": "array"}),
    },
)
_NAMESPACE_SELECTOR = _obj(any={"type": "boolean"}, matchNames={"type": "array", "items": _STR})
_DURATION_UNITS = "".join(f"(([0-9]+){unit})?" for unit in ("y", "w", "d", "h", "m", "s", "ms"))
_DURATION = {"type": "string", "pattern": f"^(0|{_DURATION_UNITS})$"}  # Prometheus durations
_RELABEL = _obj(
    sourceLabels={"type": "array", "items": _STR},
    separator=_STR,
    targetLabel=_STR,
    regex=_STR,
    replacement=_STR,
    action=_STR,
)
_ENDPOINT_FIELDS: dict[str, Any] = {
    "port": _STR,
    "path": _STR,
    "scheme": {"type": "string", "enum": ["http", "https", "HTTP", "HTTPS"]},
    "interval": _DURATION,
    "scrapeTimeout": _DURATION,
    "honorLabels": {"type": "boolean"},
    "relabelings": {"type": "array", "items": _RELABEL},
    "metricRelabelings": {"type": "array", "items": _RELABEL},
}


def _monitor(kind: str, endpoints_key: str) -> dict[str, Any]:
    spec = _obj(
        ("selector",),
        jobLabel=_STR,
        podTargetLabels={"type": "array", "items": _STR},
        selector=_SELECTOR,
        namespaceSelector=_NAMESPACE_SELECTOR,
        **{endpoints_key: {"type": "array", "minItems": 1, "items": _obj(**_ENDPOINT_FIELDS)}},
    )
    if kind == "ServiceMonitor":
        spec["properties"]["targetLabels"] = {"type": "array", "items": _STR}
    top = ("apiVersion", "kind", "metadata", "spec")
    return _obj(top, apiVersion=_STR, kind=_STR, metadata=_META, spec=spec)


_HPA_RULES = _obj(
    stabilizationWindowSeconds={"type": "integer", "minimum": 0, "maximum": 3600},
    selectPolicy=_STR,
    policies={"type": "array"},
)
_SCALED_OBJECT = _obj(
    ("apiVersion", "kind", "metadata", "spec"),
    apiVersion=_STR,
    kind=_STR,
    metadata=_META,
    spec=_obj(
        ("scaleTargetRef", "triggers"),
        scaleTargetRef=_obj(("name",), apiVersion=_STR, kind=_STR, name=_STR),
        pollingInterval=_INT,
        cooldownPeriod=_INT,
        minReplicaCount=_INT,
        maxReplicaCount=_INT,
        advanced=_obj(
            restoreToOriginalReplicaCount={"type": "boolean"},
            horizontalPodAutoscalerConfig=_obj(
                name=_STR, behavior=_obj(scaleUp=_HPA_RULES, scaleDown=_HPA_RULES)
            ),
        ),
        triggers={
            "type": "array",
            "minItems": 1,
            "items": _obj(
                ("type", "metadata"),
                type=_STR,
                name=_STR,
                metricType={"type": "string", "enum": ["AverageValue", "Value", "Utilization"]},
                metadata=_STR_MAP,
                authenticationRef=_obj(("name",), name=_STR, kind=_STR),
            ),
        },
    ),
)

# (apiVersion, kind) → schema
SCHEMAS = MappingProxyType(
    {
        ("monitoring.coreos.com/v1", "ServiceMonitor"): _monitor("ServiceMonitor", "endpoints"),
        ("monitoring.coreos.com/v1", "PodMonitor"): _monitor("PodMonitor", "podMetricsEndpoints"),
        ("keda.sh/v1alpha1", "ScaledObject"): _SCALED_OBJECT,
    }
)
