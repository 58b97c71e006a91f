"""spec.autoscaling: parsing (errors name the field, CRD defaults = operator defaults) and the
HorizontalPodAutoscaler child (Kubernetes' own strict schema is the oracle for its shape)."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from radixserve.operator.autoscaling import METRICS, horizontal_pod_autoscaler, quantity
from radixserve.operator.builders import build_children
from radixserve.operator.config import OperatorConfig
from radixserve.operator.meta import Owner
from radixserve.operator.schema import Autoscaling, SpecError
from radixserve.operator.spec import AUTOSCALING_METRICS, parse_spec
from tests.operator.cases import SMOLLM_AUTOSCALED, SMOLLM_CPU, UID

ROOT = Path(__file__).resolve().parents[2]
CRD_PATH = ROOT / "manifests" / "crds" / "inferenceservices.radixserve.io.yaml"
OWNER = Owner(name="chat", namespace="llm", uid=UID)


def _spec(**autoscaling: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMOLLM_CPU)
    spec["autoscaling"] = autoscaling
    return spec


def _crd_autoscaling_schema() -> dict[str, Any]:
    crd = yaml.safe_load(CRD_PATH.read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    return spec["properties"]["autoscaling"]


def test_parsed_with_the_crd_defaults() -> None:
    schema = _crd_autoscaling_schema()
    given = {"maxReplicas": 4, "targetPerReplica": 8}
    defaulted = {k: p["default"] for k, p in schema["properties"].items() if "default" in p}
    defaulted |= given
    parsed = parse_spec(_spec(**given), "chat").autoscaling
    assert parsed == parse_spec(_spec(**defaulted), "chat").autoscaling
    assert parsed == Autoscaling(max_replicas=4, target_per_replica=8.0)
    assert (parsed.min_replicas, parsed.metric, parsed.scale_down_stabilization_s) == (
        1,
        "requests",
        300,
    )
    assert parse_spec(SMOLLM_CPU, "chat").autoscaling is None


def test_the_crd_names_the_operators_metrics() -> None:
    enum = _crd_autoscaling_schema()["properties"]["metric"]["enum"]
    assert tuple(enum) == AUTOSCALING_METRICS == tuple(METRICS)


BASE = {"maxReplicas": 3, "targetPerReplica": 8}


@pytest.mark.parametrize(
    ("change", "field", "message"),
    [
        ({"maxReplicas": None}, "maxReplicas", "is required"),
        ({"targetPerReplica": None}, "targetPerReplica", "is required"),
        ({"minReplicas": 4}, "minReplicas", "≤ maxReplicas (3)"),
        ({"minReplicas": 0}, "minReplicas", "≥ 1"),
        ({"targetPerReplica": 0}, "targetPerReplica", "> 0"),
        ({"targetPerReplica": "8"}, "targetPerReplica", "number"),
        ({"targetPerReplica": 1.5, "metric": "kvTokenUsage"}, "targetPerReplica", "(0, 1]"),
        ({"metric": "cpu"}, "metric", "one of"),
        ({"scaleDownStabilizationSeconds": 3601}, "scaleDownStabilizationSeconds", "≤ 3600"),
        ({"scaleUp": {}}, "scaleUp", "unknown field"),
    ],
)
def test_bad_autoscaling_is_refused_naming_the_field(
    change: dict[str, Any], field: str, message: str
) -> None:
    autoscaling = {k: v for k, v in (BASE | change).items() if v is not None}
    with pytest.raises(SpecError) as err:
        parse_spec(_spec(**autoscaling), "chat")
    assert err.value.field == f"spec.autoscaling.{field}"
    assert message in str(err.value)


@pytest.mark.parametrize(
    "autoscaling",
    [
        {"minReplicas": 4, "maxReplicas": 3, "targetPerReplica": 8},
        {"minReplicas": 0, "maxReplicas": 3, "targetPerReplica": 8},
        {"maxReplicas": 3, "targetPerReplica": 0},
        {"maxReplicas": 3, "metric": "cpu", "targetPerReplica": 8},
        {"maxReplicas": 3},
        {"maxReplicas": 3, "targetPerReplica": 8, "scaleDownStabilizationSeconds": 3601},
    ],
)
def test_the_crd_schema_refuses_what_the_operator_refuses(autoscaling: dict[str, Any]) -> None:
    """The schema's own bounds (CEL min ≤ max is checked by the kind e2e suite: no CEL here)."""
    validator = jsonschema.Draft4Validator(_crd_autoscaling_schema())
    defaults = {"minReplicas": 1, "metric": "requests", "scaleDownStabilizationSeconds": 300}
    obj = defaults | autoscaling
    if obj["minReplicas"] <= obj["maxReplicas"]:
        assert list(validator.iter_errors(obj)), f"the CRD accepts {obj}"
    with pytest.raises(SpecError):
        parse_spec(_spec(**autoscaling), "chat")


@pytest.mark.parametrize("metric", sorted(METRICS))
def test_the_hpa_scales_the_inferenceservice_on_a_pods_metric(metric: str) -> None:
    target = 0.7 if METRICS[metric].is_fraction else 12
    spec = parse_spec(_spec(maxReplicas=5, targetPerReplica=target, metric=metric), "chat")
    hpa = horizontal_pod_autoscaler(OWNER, spec)
    assert hpa is not None
    kubernetes_validate.validate(hpa, "1.31.0", strict=True)
    assert hpa["metadata"]["ownerReferences"] == [OWNER.reference()]
    assert hpa["spec"]["scaleTargetRef"] == {
        "apiVersion": "radixserve.io/v1alpha1",
        "kind": "InferenceService",
        "name": "chat",
    }
    (pods,) = hpa["spec"]["metrics"]
    assert pods["type"] == "Pods"
    assert pods["pods"]["metric"]["name"] == METRICS[metric].custom_metric
    assert pods["pods"]["target"] == {"type": "AverageValue", "averageValue": quantity(target)}
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 5)
    assert hpa["spec"]["behavior"] == {"scaleDown": {"stabilizationWindowSeconds": 300}}


def test_quantities_are_what_the_api_server_writes() -> None:
    values = (8, 8.0, 0.7, 2.5, 0.05, 1000, 1200, 2_000_000)
    expected = ["8", "8", "700m", "2500m", "50m", "1k", "1200", "2M"]
    assert [quantity(v) for v in values] == expected


@pytest.mark.parametrize(("asked", "runs"), [(1, 2), (4, 4), (9, 6)])
def test_engine_replicas_stay_within_the_bounds(asked: int, runs: int) -> None:
    """spec.engine.replicas (what /scale and the HPA write) is clamped into [min, max]."""
    spec = copy.deepcopy(SMOLLM_AUTOSCALED)
    spec["engine"]["replicas"] = asked
    children = build_children(OWNER, parse_spec(spec, "chat"), OperatorConfig())
    engine = next(
        c for c in children if c["metadata"]["name"] == "chat-engine" and c["kind"] == "Deployment"
    )
    assert engine["spec"]["replicas"] == runs


def test_suspend_wins_over_autoscaling() -> None:
    spec = copy.deepcopy(SMOLLM_AUTOSCALED) | {"suspend": True}
    children = build_children(OWNER, parse_spec(spec, "chat"), OperatorConfig())
    assert "HorizontalPodAutoscaler" not in {c["kind"] for c in children}
    deployments = [c for c in children if c["kind"] == "Deployment"]
    assert [d["spec"]["replicas"] for d in deployments] == [0, 0]
