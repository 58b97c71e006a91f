"""Hardened pods and the engines' NetworkPolicy, read from the rendered children of every
sample spec. The pod rules are the Pod Security Standards' `restricted` profile (non-root,
no privilege escalation, every capability dropped, RuntimeDefault seccomp) plus what this
project promises on top: a read-only root filesystem whose only writable paths are emptyDirs,
and no service-account token in engine pods. The NetworkPolicy is checked by what it selects:
its pod selector picks exactly the engine pods' labels, its one peer exactly the router pods',
and its ports are every port the engine container listens on."""

from __future__ import annotations

from typing import Any

import kubernetes_validate
import pytest

from radixserve.operator.builders import build_children, child_refs
from radixserve.operator.config import OperatorConfig
from radixserve.operator.meta import Owner
from radixserve.operator.spec import parse_spec
from tests.operator.cases import CASES, MOE_GPU, SMOLLM_CPU, UID

OWNER = Owner(name="chat", namespace="llm", uid=UID)
K8S = "1.31.0"
ENGINE_SCRATCH = {"/tmp", "/home/radixserve/.cache", "/dev/shm"}


def _children(case: dict[str, Any], config: OperatorConfig | None = None) -> list[Any]:
    return build_children(OWNER, parse_spec(case, OWNER.name), config or OperatorConfig())


def _pods(case: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        c["metadata"]["name"]: c["spec"]["template"]
        for c in _children(case)
        if c["kind"] == "Deployment"
    }


def _matches(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_pod_meets_the_restricted_profile(case: str) -> None:
    for name, template in _pods(CASES[case]).items():
        pod = template["spec"]
        psc = pod["securityContext"]
        assert psc["runAsNonRoot"] is True and psc["runAsUser"] != 0, name
        assert psc["seccompProfile"] == {"type": "RuntimeDefault"}, name
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False, name
            assert sc["capabilities"] == {"drop": ["ALL"]}, name
            assert sc.get("privileged") is not True and "add" not in sc["capabilities"], name
            assert sc["readOnlyRootFilesystem"] is True, name


def _storage_claim(case: dict[str, Any]) -> str | None:
    """The HiCache storage claim the spec names: the one writable volume that may be shared."""
    offload = case.get("engine", {}).get("kvCache", {}).get("offload") or {}
    return (offload.get("storage", {}).get("file") or {}).get("claimName")


@pytest.mark.parametrize("case", sorted(CASES))
def test_only_emptydirs_are_writable(case: str) -> None:
    """Writable: emptyDirs, and only else the HiCache storage claim the spec itself names."""
    claim = _storage_claim(CASES[case])
    for name, template in _pods(CASES[case]).items():
        pod = template["spec"]
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        for c in pod["containers"]:
            writable = [m for m in c.get("volumeMounts", []) if not m.get("readOnly")]
            for mount in writable:
                volume = volumes[mount["name"]]
                shared = volume.get("persistentVolumeClaim", {}).get("claimName")
                if claim is not None and shared == claim:
                    assert mount["mountPath"] == "/hicache", (name, mount)
                    continue
                assert "emptyDir" in volume, (name, mount)
            paths = {m["mountPath"] for m in writable}
            assert "/tmp" in paths, name
            if name.endswith("-engine"):
                assert paths >= ENGINE_SCRATCH, name
                env = {e["name"]: e.get("value") for e in c["env"]}
                assert env["TRITON_CACHE_DIR"].startswith("/home/radixserve/.cache/")


def test_engine_pods_get_no_service_account_token_and_routers_do() -> None:
    pods = _pods(SMOLLM_CPU)
    assert pods["chat-engine"]["spec"]["automountServiceAccountToken"] is False
    # the router watches EndpointSlices with its own ServiceAccount's token
    assert pods["chat-router"]["spec"]["serviceAccountName"] == "chat-router"
    assert pods["chat-router"]["spec"].get("automountServiceAccountToken") is not False


@pytest.mark.parametrize("case", [SMOLLM_CPU, MOE_GPU], ids=["smollm-cpu", "moe-gpu-dp4"])
def test_network_policy_admits_only_the_router_on_every_engine_port(case: dict[str, Any]) -> None:
    children = _children(case, OperatorConfig(network_policy=True))
    policies = [c for c in children if c["kind"] == "NetworkPolicy"]
    assert len(policies) == 1
    policy = policies[0]
    kubernetes_validate.validate(policy, K8S, strict=True)
    refs = child_refs("chat", OperatorConfig(network_policy=True))
    assert ("networking.k8s.io/v1", "NetworkPolicy", "chat-engine") in refs
    deployments = {c["metadata"]["name"]: c for c in children if c["kind"] == "Deployment"}
    engine = deployments["chat-engine"]["spec"]["template"]
    router = deployments["chat-router"]["spec"]["template"]
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress"]
    assert _matches(spec["podSelector"]["matchLabels"], engine["metadata"]["labels"])
    assert not _matches(spec["podSelector"]["matchLabels"], router["metadata"]["labels"])
    [rule] = spec["ingress"]
    [peer] = rule["from"]
    assert set(peer) == {"podSelector"}  # same namespace, pods only: no ipBlock, no namespaces
    assert _matches(peer["podSelector"]["matchLabels"], router["metadata"]["labels"])
    assert not _matches(peer["podSelector"]["matchLabels"], engine["metadata"]["labels"])
    other = {**router["metadata"]["labels"], "app.kubernetes.io/instance": "other"}
    assert not _matches(peer["podSelector"]["matchLabels"], other)  # another service's router
    listening = {p["containerPort"] for p in engine["spec"]["containers"][0]["ports"]}
    assert {p["port"] for p in rule["ports"]} == listening


def test_no_network_policy_unless_the_operator_is_told() -> None:
    assert not [c for c in _children(SMOLLM_CPU) if c["kind"] == "NetworkPolicy"]
    assert "NetworkPolicy" not in {kind for _, kind, _ in child_refs("chat")}
    assert OperatorConfig.from_env({"RADIXSERVE_NETWORK_POLICY": "true"}).network_policy
    with pytest.raises(ValueError, match="RADIXSERVE_NETWORK_POLICY"):
        OperatorConfig.from_env({"RADIXSERVE_NETWORK_POLICY": "yes please"})
