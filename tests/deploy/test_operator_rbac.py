"""The chart's RBAC against what the operator really does, read from the operator's own code.

The operator creates, reads, patches and deletes every child its builders produce, watches
every child kind it registers a kopf handler for, and grants the router a Role: Kubernetes
refuses to let it grant rights it does not hold itself.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.deploy.render import REPO, load_yaml_documents, render_objects
from tests.deploy.validate import is_isvc, validate_k8s

EXAMPLES = sorted((REPO / "manifests" / "examples").glob("*.yaml"))
CHILD_VERBS = {"get", "create", "patch", "delete"}
WATCH_VERBS = {"get", "list", "watch"}


def _grants(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (g, r, v) for rule in rules for g in rule["apiGroups"] for r in rule["resources"]
        for v in rule["verbs"]
    }  # fmt: skip


def _operator_rule_sets() -> dict[str, set[tuple[str, str, str]]]:
    """Cluster-wide: the ClusterRole; namespaced: one watched namespace's Role (both with
    networkPolicy.enabled, so the operator also builds NetworkPolicies)."""
    clusterwide = render_objects({"networkPolicy": {"enabled": True}}, name="rs", namespace="ops")
    values = {"watch": {"namespaces": ["ml"]}, "networkPolicy": {"enabled": True}}
    namespaced = render_objects(values, name="rs", namespace="ops")
    cluster_role = next(
        o
        for o in clusterwide
        if o["kind"] == "ClusterRole" and o["metadata"]["name"] == "rs-radixserve"
    )
    role = next(o for o in namespaced if o["kind"] == "Role")
    return {"clusterwide": _grants(cluster_role["rules"]), "namespaced": _grants(role["rules"])}


def _group_resource(obj: dict[str, Any]) -> tuple[str, str]:
    api_version = obj["apiVersion"]
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    kind = obj["kind"].lower()
    return group, kind[:-1] + "ies" if kind.endswith("y") else kind + "s"


@pytest.fixture(scope="module")
def children() -> list[dict[str, Any]]:
    from radixserve.operator.builders import build_children
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.meta import Owner
    from radixserve.operator.spec import parse_spec

    built = []
    isvcs = [doc for path in EXAMPLES for doc in load_yaml_documents(path) if is_isvc(doc)]
    assert any("autoscaling" in isvc["spec"] for isvc in isvcs), "no example builds an HPA"
    for isvc in isvcs:
        owner = Owner(name=isvc["metadata"]["name"], namespace="ml", uid="0000-uid")
        spec = parse_spec(isvc["spec"], owner.name)
        built += build_children(owner, spec, OperatorConfig(network_policy=True))
    return built


@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_operator_may_manage_every_child_it_builds(
    children: list[dict[str, Any]], mode: str
) -> None:
    granted = _operator_rule_sets()[mode]
    for child in children:
        group, resource = _group_resource(child)
        missing = {v for v in CHILD_VERBS if (group, resource, v) not in granted}
        assert not missing, (
            f"{mode}: operator cannot {missing} {resource} ({child['metadata']['name']})"
        )


@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_operator_may_watch_every_child_kind_it_handles(mode: str) -> None:
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.kinds import child_kinds

    granted = _operator_rule_sets()[mode]
    for kind in child_kinds(OperatorConfig(network_policy=True)):
        missing = {v for v in WATCH_VERBS if (kind.group, kind.plural, v) not in granted}
        assert not missing, f"{mode}: kopf cannot {missing} {kind.plural}"


@pytest.mark.parametrize("mode", ["clusterwide", "namespaced"])
def test_operator_holds_every_right_it_grants(children: list[dict[str, Any]], mode: str) -> None:
    granted = _operator_rule_sets()[mode]
    roles = [c for c in children if c["kind"] == "Role"]
    assert roles, "the builders grant the router nothing?"
    for role in roles:
        assert _grants(role["rules"]) <= granted, f"{mode}: escalation needed for {role['rules']}"


def test_built_children_validate(children: list[dict[str, Any]]) -> None:
    """The objects the operator will send pass Kubernetes 1.31's schema (strict)."""
    for child in children:
        validate_k8s(child)
