"""Every kind of object the operator makes for an InferenceService, in one table.

The rest is derived from `CHILD_KINDS`: the builders stamp each manifest's apiVersion and kind
from it, the API client (`kube.py`) finds each kind's URL in it, the handlers register one
kopf watcher per kind in it (so a hand edit of any child wakes the resync at once), and the
delete and prune passes look for leftovers of every kind in it. A kind that only some
operators build (the NetworkPolicy, behind the `network_policy` setting) says so here, and
the builders, the watchers and the delete and prune passes all leave it out alike when the
setting is off: such an operator may hold no rights on it at all.
The chart's RBAC grants the verbs these readers need (tests/deploy/test_operator_rbac.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

from radixserve.operator.config import API_VERSION, KIND, PLURAL, OperatorConfig


def _always(config: OperatorConfig) -> bool:
    return True


@dataclass(frozen=True)
class ResourceKind:
    """One kind of API object: what a manifest names it by and where its URLs are."""

    api_version: str  # "apps/v1"; the core group has none: "v1"
    kind: str
    plural: str  # the URL segment (and RBAC's resource name)
    # Whether an operator with this config builds, watches and deletes objects of the kind.
    is_built: Callable[[OperatorConfig], bool] = _always

    @property
    def group(self) -> str:
        """The API group ("" for the core group), as RBAC rules name it."""
        return self.api_version.rpartition("/")[0]

    @property
    def url_prefix(self) -> str:
        return f"/apis/{self.api_version}" if self.group else f"/api/{self.api_version}"

    @property
    def kopf_resource(self) -> tuple[str, ...]:
        """The positional resource spec of a kopf handler: (group, version, plural), or
        (version, plural) for the core group."""
        return (*self.api_version.split("/"), self.plural)

    def type_meta(self) -> dict[str, str]:
        """The `apiVersion` and `kind` keys of a manifest of this kind."""
        return {"apiVersion": self.api_version, "kind": self.kind}


RBAC = "rbac.authorization.k8s.io/v1"

SERVICE_ACCOUNT = ResourceKind("v1", "ServiceAccount", "serviceaccounts")
ROLE = ResourceKind(RBAC, "Role", "roles")
ROLE_BINDING = ResourceKind(RBAC, "RoleBinding", "rolebindings")
SERVICE = ResourceKind("v1", "Service", "services")
DEPLOYMENT = ResourceKind("apps/v1", "Deployment", "deployments")
NETWORK_POLICY = ResourceKind(
    "networking.k8s.io/v1",
    "NetworkPolicy",
    "networkpolicies",
    is_built=lambda config: config.network_policy,
)
HPA = ResourceKind("autoscaling/v2", "HorizontalPodAutoscaler", "horizontalpodautoscalers")

CHILD_KINDS: tuple[ResourceKind, ...] = (
    SERVICE_ACCOUNT,
    ROLE,
    ROLE_BINDING,
    SERVICE,
    DEPLOYMENT,
    NETWORK_POLICY,
    HPA,
)
INFERENCE_SERVICE = ResourceKind(API_VERSION, KIND, PLURAL)

# (apiVersion, kind) → the kind: every kind the API client may be asked about.
BY_TYPE: Mapping[tuple[str, str], ResourceKind] = MappingProxyType(
    {(k.api_version, k.kind): k for k in (*CHILD_KINDS, INFERENCE_SERVICE)}
)


def child_kinds(config: OperatorConfig) -> tuple[ResourceKind, ...]:
    """The child kinds an operator with `config` builds, watches and may delete."""
    return tuple(kind for kind in CHILD_KINDS if kind.is_built(config))
