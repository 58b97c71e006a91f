"""The chart's monitoring values: PodMonitors / ServiceMonitors for engines and routers and the
Grafana dashboard ConfigMap, rendered and linted by real Helm, off by default.

Built-in kinds go through kubernetes-validate; the monitoring.coreos.com kinds (absent from it)
through the closed schemas of crd_schemas.py. What the monitors select is checked against the
objects the operator's own builders make: the labels of the engine and router pods and
Services, and their `http` port.
"""

from __future__ import annotations

import json
from typing import Any

import helm_python
import pytest

from tests.deploy.render import CHART, render_objects
from tests.deploy.validate import validate_any

KUBE_VERSION = "v1.31.0"
RELEASE, NAMESPACE = "rs", "serving-system"
MONITOR_KINDS = {"PodMonitor", "ServiceMonitor"}
ON: dict[str, dict[str, Any]] = {
    "pod-monitors": {"monitoring": {"podMonitor": {"enabled": True}}},
    "service-monitors": {
        "monitoring": {"serviceMonitor": {"enabled": True}, "labels": {"release": "kps"}},
        "watch": {"namespaces": ["team-a"]},
    },
    "dashboard": {
        "monitoring": {
            "dashboard": {
                "enabled": True,
                "namespace": "grafana",
                "annotations": {"grafana_folder": "LLM"},
            }
        }
    },
    "everything": {
        "monitoring": {
            "podMonitor": {"enabled": True},
            "interval": "30s",
            "dashboard": {"enabled": True},
        }
    },
}


def _render(values: dict[str, Any]) -> list[dict[str, Any]]:
    return render_objects(values, name=RELEASE, namespace=NAMESPACE)


def _kinds(objects: list[dict[str, Any]]) -> list[str]:
    return sorted(o["kind"] for o in objects)


@pytest.mark.parametrize("scenario", sorted(ON))
def test_lint_strict_and_every_object_validates(scenario: str, crd: dict[str, Any]) -> None:
    report = helm_python.lint(CHART, ON[scenario], strict=True, kube_version=KUBE_VERSION)
    assert report["errors"] == []
    assert [m for m in report["messages"] if m["severity"] >= 2] == []
    for obj in _render(ON[scenario]):
        validate_any(obj, crd)


def test_off_by_default() -> None:
    objects = _render({})
    assert not MONITOR_KINDS & set(_kinds(objects))
    assert "ConfigMap" not in _kinds(objects)


@pytest.fixture(scope="module")
def children() -> dict[str, dict[str, Any]]:
    """The operator's own children for the SmolLM2 example, by (kind, component)."""
    from radixserve.operator.builders import build_children
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.meta import Owner
    from radixserve.operator.spec import parse_spec
    from tests.deploy.render import REPO, load_yaml_documents

    isvc = load_yaml_documents(REPO / "manifests" / "examples" / "smollm2-cpu.yaml")[0]
    owner = Owner(name="smollm2", namespace="team-a", uid="uid-1")
    built = build_children(owner, parse_spec(isvc["spec"], owner.name), OperatorConfig())
    out = {}
    for child in built:
        if child["kind"] == "Deployment" or child["kind"] == "Service":
            component = child["metadata"]["labels"]["app.kubernetes.io/component"]
            out[f"{child['kind']}/{component}"] = child
    return out


def _selects(monitor: dict[str, Any], labels: dict[str, str]) -> bool:
    return monitor["spec"]["selector"]["matchLabels"].items() <= labels.items()


def test_pod_monitors_select_the_operators_engine_and_router_pods(
    children: dict[str, dict[str, Any]],
) -> None:
    monitors = [o for o in _render(ON["pod-monitors"]) if o["kind"] == "PodMonitor"]
    assert sorted(m["metadata"]["name"] for m in monitors) == [
        "rs-radixserve-engine",
        "rs-radixserve-router",
    ]
    for component in ("engine", "router"):
        template = children[f"Deployment/{component}"]["spec"]["template"]
        pod_labels = template["metadata"]["labels"]
        chosen = [m for m in monitors if _selects(m, pod_labels)]
        assert [m["metadata"]["name"] for m in chosen] == [f"rs-radixserve-{component}"]
        (endpoint,) = chosen[0]["spec"]["podMetricsEndpoints"]
        ports = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
        assert endpoint["port"] in ports and endpoint["path"] == "/metrics"
        assert endpoint["interval"] == "15s"
        relabel = endpoint["relabelings"][0]
        assert relabel["targetLabel"] == "inferenceservice"
        assert "radixserve_io_inferenceservice" in relabel["sourceLabels"][0]
        assert pod_labels["radixserve.io/inferenceservice"] == "smollm2"
        assert chosen[0]["spec"]["namespaceSelector"] == {"any": True}


def test_service_monitors_select_the_operators_services(
    children: dict[str, dict[str, Any]],
) -> None:
    monitors = [o for o in _render(ON["service-monitors"]) if o["kind"] == "ServiceMonitor"]
    assert len(monitors) == 2
    for component in ("engine", "router"):
        service = children[f"Service/{component}"]
        chosen = [m for m in monitors if _selects(m, service["metadata"]["labels"])]
        assert len(chosen) == 1, f"{component}: {len(chosen)} monitors select it"
        (endpoint,) = chosen[0]["spec"]["endpoints"]
        assert endpoint["port"] in {p["name"] for p in service["spec"]["ports"]}
        assert chosen[0]["spec"]["namespaceSelector"] == {"matchNames": ["team-a"]}
        assert chosen[0]["metadata"]["labels"]["release"] == "kps"


def test_both_monitor_kinds_at_once_is_refused() -> None:
    values = {"monitoring": {"podMonitor": {"enabled": True}, "serviceMonitor": {"enabled": True}}}
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert "not both" in str(err.value)


def test_dashboard_configmap_carries_the_json_for_the_sidecar() -> None:
    (config_map,) = [o for o in _render(ON["dashboard"]) if o["kind"] == "ConfigMap"]
    meta = config_map["metadata"]
    assert meta["labels"]["grafana_dashboard"] == "1"
    assert meta["namespace"] == "grafana"
    assert meta["annotations"] == {"grafana_folder": "LLM"}
    shipped = json.loads((CHART / "dashboards" / "radixserve.json").read_text())
    assert json.loads(config_map["data"]["radixserve.json"]) == shipped
    (default,) = [o for o in _render(ON["everything"]) if o["kind"] == "ConfigMap"]
    assert default["metadata"]["namespace"] == NAMESPACE


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"monitoring": {"podMonitor": {"enabled": "yes"}}}, "/monitoring/podMonitor/enabled"),
        ({"monitoring": {"interval": "soon"}}, "/monitoring/interval"),
        ({"monitoring": {"dashboard": {"enabled": True, "label": {}}}}, "label"),
        ({"monitoring": {"labels": {"release": 1}}}, "/monitoring/labels/release"),
    ],
)
def test_schema_rejects_bad_monitoring_values(values: dict[str, Any], field: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert field in str(err.value)
