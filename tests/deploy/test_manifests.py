"""Plain manifests: every object passes Kubernetes 1.31's schema (strict) or the CRD's schema.

The example InferenceServices are checked the way the API server would: structural defaults
from the CRD applied, then its OpenAPI schema with unknown fields refused. The CRD's CEL rules
cannot run here (no CEL evaluator), so the examples are also checked against the rules the CRD
states in words (dp divides tp under dpAttention, ep ≤ tp × dp, GPUs cover every rank).
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.render import REPO, load_yaml_documents
from tests.deploy.validate import is_isvc, validate_any, validate_isvc

MANIFESTS = REPO / "manifests"
EXAMPLES = MANIFESTS / "examples"
MANIFEST_FILES = sorted(MANIFESTS.rglob("*.yaml"))


def _example(name: str) -> dict[str, Any]:
    docs = load_yaml_documents(EXAMPLES / name)
    assert len(docs) == 1 and is_isvc(docs[0])
    return docs[0]


def test_manifest_tree_has_the_promised_files() -> None:
    names = {p.relative_to(MANIFESTS).as_posix() for p in MANIFEST_FILES}
    assert {
        "crds/inferenceservices.radixserve.io.yaml",
        "operator.yaml",
        "examples/smollm2-cpu.yaml",
        "examples/smollm2-hicache.yaml",
        "examples/smollm2-hicache-mooncake.yaml",
        "examples/qwen3-moe-dp-ep.yaml",
        "examples/deepseek-v2-lite-dp-ep.yaml",
        "examples/smollm2-autoscaled.yaml",
        "examples/keda-scaledobject.yaml",
        "examples/prometheus-adapter-rules.yaml",
    } <= names


@pytest.mark.parametrize("path", MANIFEST_FILES, ids=lambda p: p.relative_to(MANIFESTS).as_posix())
def test_every_manifest_object_validates(path: Path, crd: dict[str, Any]) -> None:
    objects = load_yaml_documents(path)
    assert objects, f"{path} holds no object"
    for obj in objects:
        validate_any(obj, crd)


def test_plain_install_is_complete() -> None:
    objects = load_yaml_documents(MANIFESTS / "operator.yaml")
    kinds = [o["kind"] for o in objects]
    assert kinds[0] == "Namespace"
    assert {"ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Deployment"} <= set(kinds)
    namespace = objects[0]["metadata"]["name"]
    for obj in objects[1:]:
        if obj["kind"] in ("ServiceAccount", "Deployment"):
            assert obj["metadata"]["namespace"] == namespace
    for obj in objects:  # a plain install is not managed by Helm
        assert "app.kubernetes.io/managed-by" not in obj["metadata"].get("labels", {})


def test_smollm2_hicache_example(crd: dict[str, Any]) -> None:
    spec = validate_isvc(_example("smollm2-hicache.yaml"), crd)["spec"]
    offload = spec["engine"]["kvCache"]["offload"]
    assert offload["hostRatio"] == 2 and offload["storage"]["file"]["sizeGB"] == 2


def test_smollm2_cpu_example(crd: dict[str, Any]) -> None:
    spec = validate_isvc(_example("smollm2-cpu.yaml"), crd)["spec"]
    assert spec["model"]["source"] == {"builtin": "smollm2-135m"}
    assert spec["engine"]["replicas"] == 2
    assert spec["engine"]["device"] == "cpu"  # the CRD's default
    assert "gpus" not in spec["engine"]["resources"]
    assert spec["router"]["policy"] == "cache_aware"


def _check_parallelism_rules(engine: dict[str, Any]) -> None:
    par = engine["parallelism"]
    if par["dpAttention"]:
        assert par["tp"] % par["dp"] == 0, "dp must divide tp when dpAttention is true"
    assert par["ep"] <= par["tp"] * par["dp"], "ep must be at most tp × dp"
    gpus = engine.get("resources", {}).get("gpus", 0)
    if gpus:
        assert engine["device"] == "cuda", "resources.gpus needs device cuda"
        ranks = par["tp"] if par["dpAttention"] else par["tp"] * par["dp"]
        assert gpus >= ranks, "resources.gpus must cover every rank"


def test_qwen3_moe_example(crd: dict[str, Any]) -> None:
    spec = validate_isvc(_example("qwen3-moe-dp-ep.yaml"), crd)["spec"]
    engine = spec["engine"]
    assert engine["parallelism"] == {"tp": 4, "dp": 4, "ep": 4, "dpAttention": True}
    assert engine["device"] == "cuda" and engine["resources"]["gpus"] == 4
    assert spec["model"]["source"]["huggingFace"]["repo"] == "Qwen/Qwen3-30B-A3B"
    _check_parallelism_rules(engine)


def test_examples_obey_the_crd_cel_rules(crd: dict[str, Any]) -> None:
    isvcs = [
        (path, doc) for path in sorted(EXAMPLES.glob("*.yaml"))
        for doc in load_yaml_documents(path) if is_isvc(doc)
    ]  # fmt: skip
    assert len(isvcs) >= 3
    for path, isvc in isvcs:
        spec = validate_isvc(isvc, crd)["spec"]
        _check_parallelism_rules(spec["engine"])
        source = spec["model"]["source"]
        assert len(source) == 1, f"{path.name}: exactly one of builtin, pvc, hostPath, huggingFace"
        if "autoscaling" in spec:
            scaling = spec["autoscaling"]
            assert scaling["minReplicas"] <= scaling["maxReplicas"], "minReplicas ≤ maxReplicas"
            if scaling["metric"] == "kvTokenUsage":
                assert scaling["targetPerReplica"] <= 1, "kvTokenUsage targets a fraction"


@pytest.mark.parametrize(
    ("field", "value", "error"),
    [
        (("spec", "engine", "replicas"), -1, "spec/engine/replicas"),
        (("spec", "engine", "replica"), 2, "'replica' was unexpected"),
        (("spec", "router", "policy"), "sticky", "spec/router/policy"),
        (("spec", "engine", "scheduler", "policy"), "lifo", "spec/engine/scheduler/policy"),
        (("spec", "engine", "kvCache", "memoryFraction"), 1.0, "memoryFraction"),
        (("spec", "engine", "parallelism", "tp"), "four", "spec/engine/parallelism/tp"),
        (("spec", "model", "source", "s3"), "bucket", "'s3' was unexpected"),
    ],
)
def test_crd_schema_rejects_a_broken_example(
    crd: dict[str, Any], field: tuple[str, ...], value: Any, error: str
) -> None:
    """The oracle bites: one bad field in an otherwise valid example is refused and named."""
    obj = copy.deepcopy(_example("qwen3-moe-dp-ep.yaml"))
    node = obj
    for key in field[:-1]:
        node = node.setdefault(key, {})
    node[field[-1]] = value
    with pytest.raises(AssertionError, match=error):
        validate_isvc(obj, crd)


def test_mooncake_example_validates_and_gets_a_master(crd: dict[str, Any]) -> None:
    from radixserve.operator.builders import build_children
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.meta import Owner
    from radixserve.operator.spec import parse_spec

    isvc = _example("smollm2-hicache-mooncake.yaml")
    spec = validate_isvc(isvc, crd)["spec"]
    name = isvc["metadata"]["name"]
    owner = Owner(name=name, namespace="llm", uid="u")
    children = build_children(owner, parse_spec(spec, name), OperatorConfig())
    masters = [c for c in children if c["metadata"]["name"] == f"{name}-mooncake"]
    assert sorted(c["kind"] for c in masters) == ["Deployment", "Service"]


def test_pd_example_validates_and_parses(crd: dict[str, Any]) -> None:
    from radixserve.operator.spec import parse_spec

    isvc = _example("smollm2-pd.yaml")
    spec = validate_isvc(isvc, crd)["spec"]
    assert spec["prefill"]["bootstrapPort"] == 8998 and spec["decode"]["replicas"] == 2
    parsed = parse_spec(spec, isvc["metadata"]["name"])
    assert parsed.pd is not None and parsed.pd.decode.replicas == 2
