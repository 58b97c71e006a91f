"""The autoscaling examples: the autoscaled InferenceService (CRD schema, and the HPA the
operator's own builders make from it), the KEDA ScaledObject alternative, and the
prometheus-adapter rules, kept in step with the metrics the operator's HPAs name.

That the engine really exports every series named here is checked against a live engine in
tests/observability/test_live_metrics.py.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest
import yaml

from radixserve.operator.autoscaling import METRICS
from tests.deploy.render import REPO, load_yaml_documents
from tests.deploy.validate import validate_isvc, validate_k8s, validate_third_party

EXAMPLES = REPO / "manifests" / "examples"
SERIES = re.compile(r"radixserve:[a-z_]+")


def _doc(name: str) -> dict[str, Any]:
    (doc,) = load_yaml_documents(EXAMPLES / name)
    return doc


def test_the_autoscaled_example_builds_a_valid_hpa(crd: dict[str, Any]) -> None:
    from radixserve.operator.builders import build_children
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.meta import Owner
    from radixserve.operator.spec import parse_spec

    isvc = validate_isvc(_doc("smollm2-autoscaled.yaml"), crd)  # with the CRD's defaults
    assert "replicas" not in _doc("smollm2-autoscaled.yaml")["spec"]["engine"], "the HPA owns it"
    owner = Owner(name=isvc["metadata"]["name"], namespace="default", uid="uid-1")
    children = build_children(owner, parse_spec(isvc["spec"], owner.name), OperatorConfig())
    hpa = next(c for c in children if c["kind"] == "HorizontalPodAutoscaler")
    validate_k8s(hpa)
    assert hpa["spec"]["scaleTargetRef"]["name"] == "smollm2-autoscaled"
    assert hpa["spec"]["minReplicas"] == isvc["spec"]["autoscaling"]["minReplicas"] == 2
    engine = next(
        c for c in children if c["kind"] == "Deployment" and "engine" in c["metadata"]["name"]
    )
    assert engine["spec"]["replicas"] == 2  # defaulted 1, kept at minReplicas


def test_keda_scales_an_example_that_has_no_hpa_of_its_own(crd: dict[str, Any]) -> None:
    scaled = _doc("keda-scaledobject.yaml")
    validate_third_party(scaled)
    ref = scaled["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"]) == ("radixserve.io/v1alpha1", "InferenceService")
    target = validate_isvc(_doc("smollm2-cpu.yaml"), crd)
    assert target["metadata"]["name"] == ref["name"]
    assert "autoscaling" not in target["spec"], "two HPAs on one target would fight"
    (trigger,) = scaled["spec"]["triggers"]
    assert (trigger["type"], trigger["metricType"]) == ("prometheus", "AverageValue")
    # the same load as the operator's `requests` metric
    assert set(SERIES.findall(trigger["metadata"]["query"])) == set(METRICS["requests"].series)
    assert f"{ref['name']}-engine-" in trigger["metadata"]["query"]  # engine pods only
    assert 1 <= scaled["spec"]["minReplicaCount"] <= scaled["spec"]["maxReplicaCount"]


def test_adapter_rules_serve_every_metric_the_operator_names() -> None:
    config_map = _doc("prometheus-adapter-rules.yaml")
    validate_k8s(config_map)
    rules = yaml.safe_load(config_map["data"]["config.yaml"])["rules"]
    served = {rule["name"]["as"]: rule for rule in rules}
    assert set(served) == {m.custom_metric for m in METRICS.values()}
    for metric in METRICS.values():
        rule = served[metric.custom_metric]
        assert rule["metricsQuery"] == metric.query
        assert rule["seriesQuery"].startswith(metric.series[0] + "{")
        assert re.fullmatch(rule["name"]["matches"], metric.series[0])
        assert set(SERIES.findall(rule["metricsQuery"])) == set(metric.series)
        overrides = rule["resources"]["overrides"]
        assert overrides == {"namespace": {"resource": "namespace"}, "pod": {"resource": "pod"}}


@pytest.mark.parametrize(
    ("path", "value", "error"),
    [
        (("spec", "minReplicaCont"), 1, "minReplicaCont"),
        (("spec", "triggers"), [], "spec/triggers"),
        (("spec", "advanced", "horizontalPodAutoscalerConfig", "name"), 1, "is not of type"),
        (("spec", "cooldownPeriod"), "5m", "spec/cooldownPeriod"),
    ],
)
def test_the_scaledobject_schema_bites(path: tuple[str, ...], value: Any, error: str) -> None:
    obj = copy.deepcopy(_doc("keda-scaledobject.yaml"))
    node = obj
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    with pytest.raises(AssertionError, match=error):
        validate_third_party(obj)
