"""Names, labels and owner references shared by every child of an InferenceService."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from radixserve.operator.config import (
    API_VERSION,
    APP_NAME,
    KIND,
    LABEL_COMPONENT,
    LABEL_INSTANCE,
    LABEL_MANAGED_BY,
    LABEL_NAME,
    LABEL_OWNER,
    LABEL_ROLE,
    MANAGED_BY,
    SERVICE_PORT,
)
from radixserve.operator.schema import SecretKeyRef

ENGINE = "engine"
ROUTER = "router"


@dataclass(frozen=True)
class Owner:
    """The InferenceService that owns the children (what an owner reference needs)."""

    name: str
    namespace: str
    uid: str

    def reference(self) -> dict[str, Any]:
        # controller=True: `kubectl get` shows the owner, and only one controller may adopt.
        # blockOwnerDeletion: foreground deletion of the InferenceService waits for children.
        return {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "name": self.name,
            "uid": self.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }


def engine_name(owner: str) -> str:
    return f"{owner}-{ENGINE}"


def router_name(owner: str) -> str:
    return f"{owner}-{ROUTER}"


def selector(owner: str, component: str) -> dict[str, str]:
    """The immutable subset of labels that Deployments and Services select on."""
    return {LABEL_NAME: APP_NAME, LABEL_INSTANCE: owner, LABEL_COMPONENT: component}


def pool_name(owner: str, role: str | None) -> str:
    """The engine pool's Deployment and Service: X-engine, or X-prefill / X-decode."""
    return engine_name(owner) if role is None else f"{owner}-{role}"


def pool_selector(owner: str, role: str | None) -> dict[str, str]:
    """Engine pods, or one role's: the role label is what sends each pool's EndpointSlices
    to the router's matching pool."""
    base = selector(owner, ENGINE)
    return base if role is None else {**base, LABEL_ROLE: role}


def pool_labels(owner: str, role: str | None) -> dict[str, str]:
    return {**labels(owner, ENGINE), **pool_selector(owner, role)}


def selector_string(owner: str, component: str) -> str:
    return ",".join(f"{k}={v}" for k, v in sorted(selector(owner, component).items()))


def labels(owner: str, component: str) -> dict[str, str]:
    return {**selector(owner, component), LABEL_MANAGED_BY: MANAGED_BY, LABEL_OWNER: owner}


def object_meta(owner: Owner, name: str, component: str) -> dict[str, Any]:
    return {
        "name": name,
        "namespace": owner.namespace,
        "labels": labels(owner.name, component),
        "ownerReferences": [owner.reference()],
    }


# The images' user (Dockerfile: uid/gid 10001) and the restricted Pod Security profile.
RUN_AS = 10001
HOME = "/home/radixserve"


def pod_security_context() -> dict[str, Any]:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def container_security_context() -> dict[str, Any]:
    """No privilege escalation, no capabilities, nothing written outside the mounted
    emptyDirs."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }


def secret_env(name: str, ref: SecretKeyRef) -> dict[str, Any]:
    """An env var whose value the kubelet reads from the Secret: the key stays out of the
    pod spec, its args and the operator's logs."""
    return {"name": name, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}


def service_url(name: str, namespace: str) -> str:
    return f"http://{name}.{namespace}.svc.cluster.local:{SERVICE_PORT}"
