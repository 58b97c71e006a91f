"""Spec → every child manifest of one InferenceService, in the order they are applied.

Dependencies first: the router's identity and RBAC before its pods, the Mooncake master (only
when the storage tier is a Mooncake store the operator runs) before the engines, the engines'
Service before the router that watches it, the user-facing Service, then the HPA (only when
`spec.autoscaling` is set and the service is not suspended). `child_refs` lists every child
the operator may own, so a child the spec no longer asks for is found and removed.
"""

from __future__ import annotations

from typing import Any

from radixserve.operator.autoscaling import horizontal_pod_autoscaler, hpa_name, pool_autoscalers
from radixserve.operator.config import OperatorConfig
from radixserve.operator.engine_manifests import engine_deployment, engine_service
from radixserve.operator.kinds import (
    DEPLOYMENT,
    HPA,
    NETWORK_POLICY,
    ROLE,
    ROLE_BINDING,
    SERVICE,
    SERVICE_ACCOUNT,
    ResourceKind,
)
from radixserve.operator.meta import Owner, engine_name, pool_name, router_name
from radixserve.operator.mooncake_manifests import (
    mooncake_master_deployment,
    mooncake_master_service,
    mooncake_name,
    owned_mooncake,
)
from radixserve.operator.network_policy import engine_network_policy
from radixserve.operator.router_manifests import (
    frontend_service,
    router_deployment,
    router_role,
    router_role_binding,
    router_service_account,
)
from radixserve.operator.schema import ROLES, InferenceServiceSpec


def build_children(
    owner: Owner, spec: InferenceServiceSpec, config: OperatorConfig
) -> list[dict[str, Any]]:
    children = [
        router_service_account(owner),
        router_role(owner),
        router_role_binding(owner),
        *_mooncake_master(owner, spec, config),
        *_engine_pools(owner, spec, config),
        router_deployment(owner, spec, config.router_image),
        frontend_service(owner),
    ]
    if NETWORK_POLICY.is_built(config):
        children.append(engine_network_policy(owner, spec))
    hpa = horizontal_pod_autoscaler(owner, spec)
    return [*children, *([] if hpa is None else [hpa]), *pool_autoscalers(owner, spec)]


def _mooncake_master(
    owner: Owner, spec: InferenceServiceSpec, config: OperatorConfig
) -> list[dict[str, Any]]:
    """The Mooncake master of the storage tier, when the operator runs it (before the engines
    that connect to it)."""
    if owned_mooncake(spec) is None:
        return []
    image = spec.engine.image or config.engine_image  # mooncake_master ships in it
    return [mooncake_master_service(owner), mooncake_master_deployment(owner, image)]


def _engine_pools(
    owner: Owner, spec: InferenceServiceSpec, config: OperatorConfig
) -> list[dict[str, Any]]:
    """The engines' Service and Deployment, or with spec.prefill / spec.decode each pool's."""
    if spec.pd is None:
        return [engine_service(owner, spec), engine_deployment(owner, spec, config.engine_image)]
    out = []
    for role in ROLES:
        pool = spec.for_role(role)
        out += [
            engine_service(owner, pool, role),
            engine_deployment(owner, pool, config.engine_image, role),
        ]
    return out


def child_refs(name: str, config: OperatorConfig | None = None) -> list[tuple[str, str, str]]:
    """(apiVersion, kind, name) of every child the operator may own, in build order (the
    optional HPAs last); needs no (valid) spec. Only of the kinds an operator with `config`
    (default: the default settings) builds: without the NetworkPolicy setting it may hold no
    rights on NetworkPolicies at all."""
    config = config or OperatorConfig()
    refs: list[tuple[ResourceKind, str]] = [
        (SERVICE_ACCOUNT, router_name(name)),
        (ROLE, router_name(name)),
        (ROLE_BINDING, router_name(name)),
        (SERVICE, mooncake_name(name)),
        (DEPLOYMENT, mooncake_name(name)),
        (SERVICE, engine_name(name)),
        (DEPLOYMENT, engine_name(name)),
        *((kind, pool_name(name, role)) for role in ROLES for kind in (SERVICE, DEPLOYMENT)),
        (DEPLOYMENT, router_name(name)),
        (SERVICE, name),
        (NETWORK_POLICY, engine_name(name)),
        (HPA, hpa_name(name)),
        *((HPA, pool_name(name, role)) for role in ROLES),
    ]
    return [(kind.api_version, kind.kind, n) for kind, n in refs if kind.is_built(config)]
