"""Autoscaling children: the HorizontalPodAutoscalers (autoscaling/v2) of one InferenceService.

Pure functions of the parsed spec. The engine's HPA scales the InferenceService itself (its
/scale subresource writes `spec.engine.replicas`), never the engine Deployment, so the operator
stays the only writer of that Deployment's replicas. PD pools each have their own HPA on their
own Deployment (one /scale subresource cannot serve two pools), which owns its replicas. Each
reads one Pods metric per engine pod through the custom metrics API; prometheus-adapter (or
KEDA) serves it from the engine's Prometheus series named in `METRICS` (docs/observability.md
has the adapter rules).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from radixserve.operator.kinds import DEPLOYMENT, HPA, INFERENCE_SERVICE
from radixserve.operator.meta import ENGINE, Owner, object_meta, pool_name
from radixserve.operator.schema import ROLES, Autoscaling, InferenceServiceSpec


@dataclass(frozen=True)
class ScalingMetric:
    """One metric `spec.autoscaling.metric` may name.

    `custom_metric` is the name the custom metrics API serves (a prometheus-adapter rule's
    `name.as`); `series` are the engine's own Prometheus series it is computed from, and
    `query` is the adapter's metricsQuery over them (per pod, summed over DP ranks).
    """

    custom_metric: str
    series: tuple[str, ...]
    query: str
    is_fraction: bool = False


def _per_pod(expr: str) -> str:
    return f"sum({expr}) by (<<.GroupBy>>)"


METRICS = MappingProxyType(
    {
        # Requests the replica holds: decoding plus waiting for a prefill slot.
        "requests": ScalingMetric(
            custom_metric="radixserve_running_queued_requests",
            series=("radixserve:num_running_reqs", "radixserve:num_queue_reqs"),
            query=_per_pod(
                "radixserve:num_running_reqs{<<.LabelMatchers>>}"
                " + radixserve:num_queue_reqs{<<.LabelMatchers>>}"
            ),
        ),
        # Requests waiting in the scheduler queue only: grows first when a replica saturates.
        "queuedRequests": ScalingMetric(
            custom_metric="radixserve_queued_requests",
            series=("radixserve:num_queue_reqs",),
            query=_per_pod("radixserve:num_queue_reqs{<<.LabelMatchers>>}"),
        ),
        # Share of the KV pool in use (0..1).
        "kvTokenUsage": ScalingMetric(
            custom_metric="radixserve_kv_token_usage",
            series=("radixserve:token_usage",),
            query=_per_pod("radixserve:token_usage{<<.LabelMatchers>>}"),
            is_fraction=True,
        ),
    }
)


def quantity(value: float) -> str:
    """`value` as the canonical Kubernetes quantity the API server writes back (so a settled
    HPA compares equal and is not patched on every pass): milli-units for fractions (0.7 →
    700m), otherwise the largest decimal suffix that keeps an integer (2000 → 2k)."""
    milli = round(value * 1000)
    if milli % 1000:
        return f"{milli}m"
    whole, suffixes = milli // 1000, ("", "k", "M", "G", "T", "P", "E")
    step = 0
    while whole and whole % 1000 == 0 and step < len(suffixes) - 1:
        whole, step = whole // 1000, step + 1
    return f"{whole}{suffixes[step]}"


def hpa_name(owner: str) -> str:
    """The HPA is named after the InferenceService it scales."""
    return owner


def _behavior(a: Autoscaling) -> dict[str, Any]:
    return {"scaleDown": {"stabilizationWindowSeconds": a.scale_down_stabilization_s}}


def horizontal_pod_autoscaler(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any] | None:
    """The HPA the spec asks for, or None: no `spec.autoscaling`, or suspended (suspend wins:
    no HPA may scale a suspended service back up)."""
    a = spec.autoscaling
    if a is None or spec.suspend:
        return None
    target = {**INFERENCE_SERVICE.type_meta(), "name": owner.name}
    return _hpa(owner, hpa_name(owner.name), target, a)


def pool_autoscalers(owner: Owner, spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """One HPA per PD pool that asks for one (none while suspended). The CRD has one /scale
    subresource, so a pool's HPA scales the pool's Deployment, and owns its replicas (the
    operator then leaves them unset, as KServe does in raw deployment mode)."""
    if spec.pd is None or spec.suspend:
        return []
    out = []
    for role in ROLES:
        a = spec.pd.scaling(role)
        if a is not None:
            name = pool_name(owner.name, role)
            target = {**DEPLOYMENT.type_meta(), "name": name}
            out.append(_hpa(owner, name, target, a))
    return out


def _hpa(owner: Owner, name: str, target: dict[str, Any], a: Autoscaling) -> dict[str, Any]:
    metric = METRICS[a.metric]
    return {
        **HPA.type_meta(),
        "metadata": object_meta(owner, name, ENGINE),
        "spec": {
            "scaleTargetRef": target,
            "minReplicas": a.min_replicas,
            "maxReplicas": a.max_replicas,
            "metrics": [
                {
                    "type": "Pods",
                    "pods": {
                        "metric": {"name": metric.custom_metric},
                        "target": {
                            "type": "AverageValue",
                            "averageValue": quantity(a.target_per_replica),
                        },
                    },
                }
            ],
            "behavior": _behavior(a),
        },
    }
