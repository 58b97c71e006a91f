"""Spec → every child manifest of one InferenceService, in the order they are applied.

Dependencies first: the router's identity and RBAC before its pods, the engines' Service
before the router that watches it, the user-facing Service last.
"""

from __future__ import annotations

from typing import Any

from radixserve.operator.config import OperatorConfig
from radixserve.operator.engine_manifests import engine_deployment, engine_service
from radixserve.operator.meta import Owner, engine_name, router_name
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
    return [
        router_service_account(owner),
        router_role(owner),
        router_role_binding(owner),
        engine_service(owner, spec),
        engine_deployment(owner, spec, config.engine_image),
        router_deployment(owner, spec, config.router_image),
        frontend_service(owner),
    ]


def child_refs(name: str) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every child, in build order; needs no (valid) spec."""
    return [
        ("v1", "ServiceAccount", router_name(name)),
        (RBAC, "Role", router_name(name)),
        (RBAC, "RoleBinding", router_name(name)),
        ("v1", "Service", engine_name(name)),
        ("apps/v1", "Deployment", engine_name(name)),
        ("apps/v1", "Deployment", router_name(name)),
        ("v1", "Service", name),
    ]
