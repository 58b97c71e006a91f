"""The Helm chart, rendered and linted by real Helm (helm-python-sdk, Helm v4 in-process).

Every rendered object must pass the Kubernetes 1.31 OpenAPI schema in strict mode; the example
InferenceService must pass the CRD's own schema; bad values must be refused by
values.schema.json with a message naming the field.
"""

from __future__ import annotations

from typing import Any

import helm_python
import pytest
import yaml

from tests.deploy.cli import parse_cli
from tests.deploy.render import (
    CHART,
    CRD_CHART_COPY,
    CRD_SOURCE,
    PLAIN_INSTALL,
    load_yaml_documents,
    plain_install_objects,
    render_files,
    render_objects,
)
from tests.deploy.validate import validate_any

KUBE_VERSION = "v1.31.0"
RELEASE, NAMESPACE = "rs", "serving-system"

SCENARIOS: dict[str, dict[str, Any]] = {
    "defaults": {},
    "namespaced": {"watch": {"namespaces": ["team-a", "team-b"]}, "logLevel": "debug"},
    "network-policy": {"watch": {"namespaces": ["team-a"]}, "networkPolicy": {"enabled": True}},
    "kind-local": {
        "image": {"repository": "radixserve/operator", "tag": "e2e", "pullPolicy": "Never"},
        "defaultImages": {
            "engine": {"repository": "radixserve/engine", "tag": "e2e"},
            "router": {"repository": "radixserve/router", "tag": "e2e"},
        },
        "healthPort": 0,
    },
    "existing-account": {
        "serviceAccount": {"create": False, "name": "ops"},
        "rbac": {"create": False},
    },
    "scheduling": {
        "fullnameOverride": "isvc-operator",
        "imagePullSecrets": [{"name": "regcred"}],
        "serviceAccount": {"create": True, "annotations": {"iam.example.com/role": "ops"}},
        "nodeSelector": {"kubernetes.io/os": "linux"},
        "tolerations": [
            {"key": "dedicated", "operator": "Equal", "value": "ops", "effect": "NoSchedule"}
        ],
        "affinity": {
            "nodeAffinity": {
                "requiredDuringSchedulingIgnoredDuringExecution": {
                    "nodeSelectorTerms": [
                        {"matchExpressions": [{"key": "pool", "operator": "In", "values": ["ops"]}]}
                    ]
                }
            }
        },
        "priorityClassName": "system-cluster-critical",
        "podAnnotations": {"prometheus.io/scrape": "false"},
        "podLabels": {"team": "ml"},
        "extraEnv": [{"name": "KOPF_LOG", "value": "1"}],
        "rbac": {"create": True, "aggregateToDefaultRoles": False},
    },
    "example": {"example": {"enabled": True, "name": "demo", "replicas": 3}},
    "example-offload": {
        "example": {
            "enabled": True,
            "name": "demo",
            "replicas": 3,
            "kvOffload": {"hostRatio": 2, "storage": {"file": {"sizeGB": 2}}},
        }
    },
    "example-pd": {"example": {"enabled": True, "name": "demo", "pd": {"prefill": 2, "decode": 3}}},
    "example-mooncake": {
        "example": {
            "enabled": True,
            "name": "demo",
            "kvOffload": {"storage": {"mooncake": {"segmentSizeGB": 1}}},
        }
    },
}


def _render(scenario: str) -> list[dict[str, Any]]:
    return render_objects(SCENARIOS[scenario], name=RELEASE, namespace=NAMESPACE)


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, got {len(found)}"
    return found[0]


def _template_of(scenario: str, kind: str) -> str:
    """The chart template that renders the one `kind` object of `scenario`, for messages."""
    files = render_files(SCENARIOS[scenario], name=RELEASE, namespace=NAMESPACE)
    [path] = [
        path
        for path, text in files.items()
        if path.endswith(".yaml") and any(d and d["kind"] == kind for d in yaml.safe_load_all(text))
    ]
    return f"charts/{path} with the {scenario!r} values"


def _container(objects: list[dict[str, Any]]) -> dict[str, Any]:
    pod = _one(objects, "Deployment")["spec"]["template"]["spec"]
    assert len(pod["containers"]) == 1
    return pod["containers"][0]


def _rule_set(rules: list[dict[str, Any]]) -> set[tuple[str, str, str]]:
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_lint_strict_is_clean(scenario: str) -> None:
    report = helm_python.lint(CHART, SCENARIOS[scenario], strict=True, kube_version=KUBE_VERSION)
    assert report["errors"] == []
    # severity 1 is INFO ("icon is recommended"); warnings and errors would fail --strict
    assert [m for m in report["messages"] if m["severity"] >= 2] == []


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_every_rendered_object_validates(scenario: str, crd: dict[str, Any]) -> None:
    objects = _render(scenario)
    assert objects, "the chart rendered nothing"
    for obj in objects:
        validate_any(obj, crd)
    names = [(o["kind"], o["metadata"]["name"], o["metadata"].get("namespace")) for o in objects]
    assert len(names) == len(set(names)), f"duplicate objects: {names}"


def test_operator_deployment_defaults() -> None:
    objects = _render("defaults")
    app_version = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]
    deploy = _one(objects, "Deployment", RELEASE + "-radixserve")
    assert deploy["metadata"]["namespace"] == NAMESPACE
    # one kopf instance at a time: standalone kopf has no peering to arbitrate two
    assert deploy["spec"]["replicas"] == 1
    assert deploy["spec"]["strategy"]["type"] == "Recreate"
    selector = deploy["spec"]["selector"]["matchLabels"]
    pod_labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert selector.items() <= pod_labels.items()
    container = _container(objects)
    assert container["image"] == f"radixserve/operator:{app_version}"
    assert container["command"] == ["radixserve"]
    assert container["args"] == [
        "--log-level",
        "info",
        "operator",
        "--liveness",
        "http://0.0.0.0:8080/healthz",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RADIXSERVE_ENGINE_IMAGE"] == f"radixserve/engine:{app_version}"
    assert env["RADIXSERVE_ROUTER_IMAGE"] == f"radixserve/router:{app_version}"
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert container["ports"] == [{"name": "health", "containerPort": 8080, "protocol": "TCP"}]
    pod = deploy["spec"]["template"]["spec"]
    assert pod["serviceAccountName"] == RELEASE + "-radixserve"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"]["drop"] == ["ALL"]


@pytest.mark.parametrize("scenario", ["defaults", "namespaced", "kind-local"])
def test_operator_reads_the_rendered_settings(scenario: str) -> None:
    """The operator's own CLI and settings loader, fed the rendered args and env, see the
    chart's values."""
    from radixserve.operator.config import OperatorConfig

    container = _container(_render(scenario))
    env = {e["name"]: e["value"] for e in container["env"] if "value" in e}
    config = OperatorConfig.from_env(env)
    assert config.engine_image == env["RADIXSERVE_ENGINE_IMAGE"]
    assert config.router_image == env["RADIXSERVE_ROUTER_IMAGE"]
    watched = SCENARIOS[scenario].get("watch", {}).get("namespaces", [])
    assert config.namespaces == tuple(watched)
    args = parse_cli(container["args"], _template_of(scenario, "Deployment"))
    health = SCENARIOS[scenario].get("healthPort", 8080)
    assert args.liveness == (f"http://0.0.0.0:{health}/healthz" if health else "")


def test_kind_local_values_reach_the_pod() -> None:
    objects = _render("kind-local")
    container = _container(objects)
    assert container["image"] == "radixserve/operator:e2e"
    assert container["imagePullPolicy"] == "Never"
    assert container["args"][-2:] == ["--liveness", ""]  # the operator's health server is off
    assert "livenessProbe" not in container and "ports" not in container
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RADIXSERVE_ENGINE_IMAGE"] == "radixserve/engine:e2e"
    assert env["RADIXSERVE_ROUTER_IMAGE"] == "radixserve/router:e2e"


def test_clusterwide_rbac_is_least_privilege() -> None:
    objects = _render("defaults")
    role = _one(objects, "ClusterRole", RELEASE + "-radixserve")
    granted = _rule_set(role["rules"])
    for group, resource, verb in granted:
        assert "*" not in (group, resource, verb)
    resources = {(g, r) for g, r, _ in granted}
    assert resources == {
        ("apiextensions.k8s.io", "customresourcedefinitions"),
        ("radixserve.io", "inferenceservices"),
        ("radixserve.io", "inferenceservices/status"),
        ("apps", "deployments"),
        ("autoscaling", "horizontalpodautoscalers"),
        ("", "services"),
        ("", "serviceaccounts"),
        ("rbac.authorization.k8s.io", "roles"),
        ("rbac.authorization.k8s.io", "rolebindings"),
        ("discovery.k8s.io", "endpointslices"),
        ("", "events"),
    }
    # read-only where the operator only reads, and no namespace listing in cluster-wide mode
    assert {v for g, r, v in granted if r == "customresourcedefinitions"} == {
        "get",
        "list",
        "watch",
    }
    assert {v for g, r, v in granted if r == "endpointslices"} == {"get", "list", "watch"}
    assert {v for g, r, v in granted if r == "events"} == {"create", "patch"}
    assert "create" not in {v for g, r, v in granted if r.startswith("inferenceservices")}
    binding = _one(objects, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": RELEASE + "-radixserve", "namespace": NAMESPACE}
    ]


def test_operator_holds_what_it_grants_the_router() -> None:
    """RBAC forbids granting a right one does not hold: the router Role needs these."""
    router_role = {("discovery.k8s.io", "endpointslices", v) for v in ("get", "list", "watch")}
    operator_role = _one(_render("defaults"), "ClusterRole", RELEASE + "-radixserve")
    assert router_role <= _rule_set(operator_role["rules"])
    namespaced_roles = [o for o in _render("namespaced") if o["kind"] == "Role"]
    assert len(namespaced_roles) == 2
    for role in namespaced_roles:
        assert router_role <= _rule_set(role["rules"]), role["metadata"]


def test_namespaced_mode_grants_nothing_cluster_wide() -> None:
    """No ClusterRoleBinding at all, and the only ClusterRoles are the aggregated edit/view
    ones (bound by no one here) over InferenceServices alone; every operator right is in a
    Role of a listed namespace."""
    for scenario in ("namespaced", "network-policy"):
        objects = _render(scenario)
        assert not [o for o in objects if o["kind"] == "ClusterRoleBinding"], scenario
        for role in (o for o in objects if o["kind"] == "ClusterRole"):
            labels = role["metadata"]["labels"]
            assert any(k.startswith("rbac.authorization.k8s.io/aggregate-to-") for k in labels)
            assert {g for g, _, _ in _rule_set(role["rules"])} == {"radixserve.io"}, scenario
        bindings = [o for o in objects if o["kind"] == "RoleBinding"]
        listed = set(SCENARIOS[scenario]["watch"]["namespaces"])
        assert {b["metadata"]["namespace"] for b in bindings} == listed


def test_namespaced_mode_grants_only_listed_namespaces() -> None:
    objects = _render("namespaced")
    clusterwide = _one(_render("defaults"), "ClusterRole", RELEASE + "-radixserve")
    kopf_discovery = {("apiextensions.k8s.io", "customresourcedefinitions")}
    expected = {r for r in _rule_set(clusterwide["rules"]) if r[:2] not in kopf_discovery}
    for ns in ("team-a", "team-b"):
        role = _one([o for o in objects if o["metadata"].get("namespace") == ns], "Role")
        assert _rule_set(role["rules"]) == expected
        binding = _one([o for o in objects if o["metadata"].get("namespace") == ns], "RoleBinding")
        assert binding["roleRef"] == {
            "apiGroup": "rbac.authorization.k8s.io",
            "kind": "Role",
            "name": role["metadata"]["name"],
        }
        assert binding["subjects"][0]["namespace"] == NAMESPACE
    container = _container(objects)
    assert container["args"][:3] == ["--log-level", "debug", "operator"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RADIXSERVE_WATCH_NAMESPACES"] == "team-a,team-b"
    default_env = [e["name"] for e in _container(_render("defaults"))["env"]]
    assert "RADIXSERVE_WATCH_NAMESPACES" not in default_env


def test_existing_account_without_rbac() -> None:
    objects = _render("existing-account")
    assert {o["kind"] for o in objects} == {"Deployment"}
    assert _one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "ops"


def test_scheduling_values_reach_the_pod() -> None:
    objects = _render("scheduling")
    values = SCENARIOS["scheduling"]
    deploy = _one(objects, "Deployment", "isvc-operator")
    pod = deploy["spec"]["template"]["spec"]
    for key in ("nodeSelector", "tolerations", "affinity", "priorityClassName", "imagePullSecrets"):
        assert pod[key] == values[key]
    template_meta = deploy["spec"]["template"]["metadata"]
    assert template_meta["annotations"] == values["podAnnotations"]
    assert template_meta["labels"]["team"] == "ml"
    assert {"name": "KOPF_LOG", "value": "1"} in _container(objects)["env"]
    account = _one(objects, "ServiceAccount", "isvc-operator")
    assert account["metadata"]["annotations"] == {"iam.example.com/role": "ops"}
    assert [o["metadata"]["name"] for o in objects if o["kind"] == "ClusterRole"] == [
        "isvc-operator"
    ]


def test_aggregated_roles_let_editors_scale() -> None:
    objects = _render("defaults")
    edit = _one(objects, "ClusterRole", RELEASE + "-radixserve-edit")
    assert edit["metadata"]["labels"]["rbac.authorization.k8s.io/aggregate-to-edit"] == "true"
    assert ("radixserve.io", "inferenceservices/scale", "patch") in _rule_set(edit["rules"])
    view = _one(objects, "ClusterRole", RELEASE + "-radixserve-view")
    assert {v for _, _, v in _rule_set(view["rules"])} == {"get", "list", "watch"}


def test_example_matches_the_manifest_example() -> None:
    from tests.deploy.render import REPO

    rendered = _one(_render("example"), "InferenceService", "demo")
    manifest = load_yaml_documents(REPO / "manifests" / "examples" / "smollm2-cpu.yaml")[0]
    expected = manifest["spec"]
    expected["engine"]["replicas"] = 3
    assert rendered["spec"] == expected
    assert rendered["metadata"]["namespace"] == NAMESPACE
    # its labels must never match the operator Deployment's selector
    selector = _one(_render("example"), "Deployment")["spec"]["selector"]["matchLabels"]
    assert not selector.items() <= rendered["metadata"]["labels"].items()


def test_example_kv_offload_reaches_the_spec() -> None:
    rendered = _one(_render("example-offload"), "InferenceService", "demo")
    offload = rendered["spec"]["engine"]["kvCache"]["offload"]
    assert offload == {"hostRatio": 2, "storage": {"file": {"sizeGB": 2}}}


def test_example_mooncake_offload_gets_the_operators_master() -> None:
    """The rendered example, as the operator reads it, runs a Mooncake master of its own."""
    from radixserve.operator.builders import build_children
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.meta import Owner
    from radixserve.operator.spec import parse_spec

    rendered = _one(_render("example-mooncake"), "InferenceService", "demo")
    spec = parse_spec(rendered["spec"], "demo")
    children = build_children(Owner("demo", NAMESPACE, "u"), spec, OperatorConfig())
    assert ("Deployment", "demo-mooncake") in {(c["kind"], c["metadata"]["name"]) for c in children}


def test_example_pd_is_the_pd_manifest_and_the_operator_renders_both_pools() -> None:
    from radixserve.operator.builders import build_children
    from radixserve.operator.config import OperatorConfig
    from radixserve.operator.meta import Owner
    from radixserve.operator.spec import parse_spec
    from tests.deploy.render import REPO

    rendered = _one(_render("example-pd"), "InferenceService", "demo")
    manifest = load_yaml_documents(REPO / "manifests" / "examples" / "smollm2-pd.yaml")[0]
    expected = manifest["spec"]
    expected["prefill"]["replicas"], expected["decode"]["replicas"] = 2, 3
    assert rendered["spec"] == expected
    spec = parse_spec(rendered["spec"], "demo")
    children = build_children(Owner("demo", NAMESPACE, "u"), spec, OperatorConfig())
    replicas = {
        c["metadata"]["name"]: c["spec"].get("replicas")
        for c in children
        if c["kind"] == "Deployment"
    }
    assert replicas["demo-prefill"] == 2 and replicas["demo-decode"] == 3


def test_notes_name_the_namespaces() -> None:
    notes = render_files(SCENARIOS["namespaced"], name=RELEASE, namespace=NAMESPACE)
    text = next(v for k, v in notes.items() if k.endswith("NOTES.txt"))
    assert "team-a, team-b" in text
    assert f"deployment/{RELEASE}-radixserve" in text


@pytest.mark.parametrize(
    ("values", "field"),
    [
        ({"watch": {"namespaces": "team-a"}}, "/watch/namespaces"),
        ({"watch": {"namespaces": ["Team_A"]}}, "/watch/namespaces/0"),
        ({"image": {"repository": "x", "pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
        ({"logLevel": "verbose"}, "/logLevel"),
        ({"healthPort": 70000}, "/healthPort"),
        ({"replicas": 2}, "replicas"),
        ({"rbac": {"create": "yes"}}, "/rbac/create"),
        ({"example": {"enabled": True, "replicas": -1}}, "/example/replicas"),
        ({"example": {"enabled": True, "pd": {"prefill": 1}}}, "/example/pd"),
        ({"example": {"enabled": True, "pd": {"prefill": 0, "decode": 1}}}, "/example/pd/prefill"),
    ],
)
def test_schema_rejects_bad_values(values: dict[str, Any], field: str) -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmValuesError) as err:
        chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    assert field in str(err.value)


def test_missing_account_name_is_a_clear_error() -> None:
    with helm_python.Chart.load(CHART) as chart, pytest.raises(helm_python.HelmError) as err:
        chart.render({"serviceAccount": {"create": False}}, name=RELEASE, namespace=NAMESPACE)
    assert "serviceAccount.name is required" in str(err.value)


def test_chart_crd_is_a_byte_identical_copy() -> None:
    assert CRD_CHART_COPY.read_bytes() == CRD_SOURCE.read_bytes(), (
        f"copy {CRD_SOURCE.name} from manifests/crds/ into {CRD_CHART_COPY.parent}"
    )
    with helm_python.Chart.load(CHART) as chart:
        assert [c["name"] for c in chart.crds] == [f"crds/{CRD_SOURCE.name}"]


def test_plain_install_is_the_chart_render() -> None:
    """manifests/operator.yaml must not drift from the chart (tests/deploy/render.py writes it)."""
    assert load_yaml_documents(PLAIN_INSTALL) == plain_install_objects(), (
        "manifests/operator.yaml is stale: run .venv/bin/python tests/deploy/render.py"
    )


def test_e2e_values_install_local_images() -> None:
    """The kind suite's values file and --set flags pass the schema and pin every image."""
    from tests.e2e.kind import KIND_VALUES, helm_sets, image_name

    values = helm_python.values_from_yaml(KIND_VALUES.read_text())
    for assignment in helm_sets("t1"):  # what `helm --set` does, in order
        values = _deep_merge(values, helm_python.parse_set_string(assignment))
    objects = render_objects(values, name="radixserve", namespace="radixserve-system")
    container = _container(objects)
    assert container["image"] == image_name("operator", "t1")
    assert container["imagePullPolicy"] == "Never"
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["RADIXSERVE_ENGINE_IMAGE"] == image_name("engine", "t1")
    assert env["RADIXSERVE_ROUTER_IMAGE"] == image_name("router", "t1")


def _deep_merge(base: dict[str, Any], override: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def test_network_policy_value_tells_the_operator_and_grants_it_network_policies() -> None:
    objects = _render("network-policy")
    env = {e["name"]: e.get("value") for e in _container(objects)["env"]}
    assert env["RADIXSERVE_NETWORK_POLICY"] == "true"
    role = _one([o for o in objects if o["metadata"].get("namespace") == "team-a"], "Role")
    rights = {(g, r, v) for g, r, v in _rule_set(role["rules"]) if r == "networkpolicies"}
    assert {v for _, _, v in rights} >= {"get", "create", "patch", "delete"}
    off = _render("namespaced")
    assert "RADIXSERVE_NETWORK_POLICY" not in {e["name"] for e in _container(off)["env"]}
    for role in (o for o in off if o["kind"] in ("Role", "ClusterRole")):
        assert not [r for r in _rule_set(role["rules"]) if r[1] == "networkpolicies"]


def test_a_subcommand_the_cli_lacks_fails_naming_it_and_the_template() -> None:
    """A typo in a template's subcommand fails the chart tests instead of skipping them."""
    source = _template_of("defaults", "Deployment")
    argv = ["--log-level", "info", "operatr", "--liveness", ""]
    with pytest.raises(pytest.fail.Exception, match="deployment.yaml .*`radixserve operatr`"):
        parse_cli(argv, source)
