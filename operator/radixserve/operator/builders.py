"""Spec → every child manifest of one InferenceService, in the order they are applied.

Dependencies first: the router's identity and RBAC before its pods, the engines' Service
before the router that watches it, the user-facing Service, then the HPA (only when
`spec.autoscaling` is set and the service is not suspended). `child_refs` lists every child
the operator may own, so a child the spec no longer asks for is found and removed.
"""

from __future__ import annotations

from typing import Any

from radixserve.operator.autoscaling import (
    HPA_API_VERSION,
    HPA_KIND,
    horizontal_pod_autoscaler,
    hpa_name,
)
from radixserve.operator.config import OperatorConfig
from radixserve.operator.engine_manifests import engine_deployment, engine_service
from radixserve.operator.meta import Owner, engine_name, router_name
from radixserve.operator.network_policy import API_VERSION as NETPOL_API_VERSION
from radixserve.operator.network_policy import KIND as NETPOL_KIND
from radixserve.operator.network_policy import engine_network_policy
from radixserve.operator.router_manifests import (
    frontend_service,
    router_deployment,
    router_role,
    router_role_binding,
    router_service_account,
)
from radixserve.operator.schema import InferenceServiceSpec

RBAC = "rbac.authorization.k8s.io/v1"


def build_children(
    owner: Owner, spec: InferenceServiceSpec, config: OperatorConfig
) -> list[dict[str, Any]]:
    children = [
        router_service_account(owner),
        router_role(owner),
        router_role_binding(owner),
        engine_service(owner, spec),
        engine_deployment(owner, spec, config.engine_image),
        router_deployment(owner, spec, config.router_image),
        frontend_service(owner),
    ]
    if config.network_policy:
        children.append(engine_network_policy(owner, spec))
    hpa = horizontal_pod_autoscaler(owner, spec)
    return children if hpa is None else [*children, hpa]


def child_refs(name: str, network_policy: bool = False) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every child the operator may own, in build order (the
    optional HPA last); needs no (valid) spec. The NetworkPolicy only when the operator
    renders them (otherwise it may hold no rights on NetworkPolicies at all)."""
    netpol = [(NETPOL_API_VERSION, NETPOL_KIND, engine_name(name))] if network_policy else []
    return [
        ("v1", "ServiceAccount", router_name(name)),
        (RBAC, "Role", router_name(name)),
        (RBAC, "RoleBinding", router_name(name)),
        ("v1", "Service", engine_name(name)),
        ("apps/v1", "Deployment", engine_name(name)),
        ("apps/v1", "Deployment", router_name(name)),
        ("v1", "Service", name),
        *netpol,
        (HPA_API_VERSION, HPA_KIND, hpa_name(name)),
    ]
