"""Router children: its ServiceAccount + Role + RoleBinding (watch EndpointSlices), its
Deployment, and the Service `X` that users call. Pure functions of the parsed spec."""

from __future__ import annotations

from types import MappingProxyType
from typing import Any

from radixserve.operator.config import ROUTER_PORT, SERVICE_PORT
from radixserve.operator.kinds import DEPLOYMENT, ROLE, ROLE_BINDING, SERVICE, SERVICE_ACCOUNT
from radixserve.operator.meta import (
    ROUTER,
    Owner,
    container_security_context,
    engine_name,
    labels,
    object_meta,
    pod_security_context,
    pool_name,
    router_name,
    secret_env,
    selector,
)
from radixserve.operator.schema import DECODE, PREFILL, InferenceServiceSpec

ROUTER_REQUESTS = MappingProxyType({"cpu": "100m", "memory": "256Mi"})
# The router's secret flags read from these when unset (radixserve.router.config).
ROUTER_KEY_ENV = "RADIXSERVE_ROUTER_API_KEY"
ROUTER_WORKER_KEY_ENV = "RADIXSERVE_ROUTER_WORKER_API_KEY"
ROUTER_ADMIN_KEY_ENV = "RADIXSERVE_ROUTER_ADMIN_KEY"


def router_args(owner: Owner, spec: InferenceServiceSpec) -> list[str]:
    r = spec.router
    args = ["router", "--host", "0.0.0.0", "--port", str(ROUTER_PORT)]
    if spec.pd is None:
        args += ["--k8s-service", engine_name(owner.name)]
    else:  # each pool from its role's Service; the decode pool by load (the router's default)
        args += ["--pd-disaggregation", "--k8s-prefill-service", pool_name(owner.name, PREFILL)]
        args += ["--k8s-decode-service", pool_name(owner.name, DECODE)]
        args += ["--k8s-bootstrap-port", str(spec.pd.bootstrap_port)]
    args += ["--k8s-namespace", owner.namespace]
    args += ["--policy", r.policy]
    args += ["--cache-threshold", str(r.cache_threshold)]
    args += ["--balance-abs-threshold", str(r.balance_abs_threshold)]
    args += ["--balance-rel-threshold", str(r.balance_rel_threshold)]
    return args


def router_env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    """spec.apiKeySecretRef: what clients must send and what the router sends to the engines;
    spec.router.adminKeySecretRef: the admin API's key. Env from the Secrets, never args."""
    env: list[dict[str, Any]] = []
    if spec.api_key is not None:
        env += [secret_env(ROUTER_KEY_ENV, spec.api_key)]
        env += [secret_env(ROUTER_WORKER_KEY_ENV, spec.api_key)]
    if spec.router.admin_key is not None:
        env.append(secret_env(ROUTER_ADMIN_KEY_ENV, spec.router.admin_key))
    return env


def router_service_account(owner: Owner) -> dict[str, Any]:
    return {
        **SERVICE_ACCOUNT.type_meta(),
        "metadata": object_meta(owner, router_name(owner.name), ROUTER),
    }


def router_role(owner: Owner) -> dict[str, Any]:
    """Read-only, namespaced, EndpointSlices only: all the router needs to find engines."""
    return {
        **ROLE.type_meta(),
        "metadata": object_meta(owner, router_name(owner.name), ROUTER),
        "rules": [
            {
                "apiGroups": ["discovery.k8s.io"],
                "resources": ["endpointslices"],
                "verbs": ["get", "list", "watch"],
            }
        ],
    }


def router_role_binding(owner: Owner) -> dict[str, Any]:
    name = router_name(owner.name)
    return {
        **ROLE_BINDING.type_meta(),
        "metadata": object_meta(owner, name, ROUTER),
        "roleRef": {"apiGroup": ROLE.group, "kind": ROLE.kind, "name": name},
        "subjects": [{"kind": SERVICE_ACCOUNT.kind, "name": name, "namespace": owner.namespace}],
    }


def _probe(path: str, period: int, failures: int) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": 3,
        "failureThreshold": failures,
    }


def router_deployment(owner: Owner, spec: InferenceServiceSpec, image: str) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": ROUTER,
        "image": spec.router.image or image,
        "command": ["radixserve"],
        "args": router_args(owner, spec),
        "ports": [{"name": "http", "containerPort": ROUTER_PORT, "protocol": "TCP"}],
        "resources": {"requests": dict(ROUTER_REQUESTS)},
        # Ready only with at least one healthy engine: the Service then never routes to a
        # router that would answer 503.
        "readinessProbe": _probe("/readiness", 5, 3),
        "livenessProbe": _probe("/health", 10, 3),
        "securityContext": container_security_context(),
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # the root fs is read-only
    }
    env = router_env(spec)
    if env:
        container["env"] = env
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": object_meta(owner, router_name(owner.name), ROUTER),
        "spec": {
            "replicas": 0 if spec.suspend else spec.router.replicas,
            "selector": {"matchLabels": selector(owner.name, ROUTER)},
            "template": {
                "metadata": {"labels": labels(owner.name, ROUTER)},
                "spec": {
                    "serviceAccountName": router_name(owner.name),
                    "enableServiceLinks": False,
                    "securityContext": pod_security_context(),
                    "terminationGracePeriodSeconds": 30,
                    "containers": [container],
                    "volumes": [{"name": "tmp", "emptyDir": {}}],
                },
            },
        },
    }


def frontend_service(owner: Owner) -> dict[str, Any]:
    """`X`: what clients call (port 80 → the routers' `http` port)."""
    return {
        **SERVICE.type_meta(),
        "metadata": object_meta(owner, owner.name, ROUTER),
        "spec": {
            "type": "ClusterIP",
            "selector": selector(owner.name, ROUTER),
            "ports": [
                {"name": "http", "port": SERVICE_PORT, "targetPort": "http", "protocol": "TCP"}
            ],
        },
    }
