"""Render the Helm chart with real Helm (helm-python-sdk) and derive the plain operator install.

`manifests/operator.yaml` is the chart rendered with its default values for release `radixserve`
in namespace `radixserve-system`, plus that Namespace, minus the labels only Helm sets. A test
compares the two, so after a chart change regenerate the file (from the repository root):

    .venv/bin/python tests/deploy/render.py
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import helm_python
import yaml

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "radixserve"
CRD_NAME = "inferenceservices.radixserve.io.yaml"
CRD_SOURCE = REPO / "manifests" / "crds" / CRD_NAME
CRD_CHART_COPY = CHART / "crds" / CRD_NAME
PLAIN_INSTALL = REPO / "manifests" / "operator.yaml"
PLAIN_RELEASE = "radixserve"
PLAIN_NAMESPACE = "radixserve-system"
# Labels that say "Helm manages this": false in a plain kubectl install.
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
# Apply order for a plain install: the namespace and identities before what uses them.
KIND_ORDER = ("Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role")
KIND_ORDER += ("RoleBinding", "Deployment")

Obj = dict[str, Any]


def render_files(
    values: dict[str, Any] | None = None,
    *,
    name: str = PLAIN_RELEASE,
    namespace: str = PLAIN_NAMESPACE,
) -> dict[str, str]:
    """Template path → rendered text, exactly as `helm install` would produce it."""
    with helm_python.Chart.load(CHART) as chart:
        return chart.render(values or {}, name=name, namespace=namespace, is_install=True)


def render_objects(
    values: dict[str, Any] | None = None,
    *,
    name: str = PLAIN_RELEASE,
    namespace: str = PLAIN_NAMESPACE,
) -> list[Obj]:
    """Every Kubernetes object the chart renders (NOTES.txt and empty documents left out)."""
    files = render_files(values, name=name, namespace=namespace)
    objects: list[Obj] = []
    for path in sorted(files):
        if path.endswith((".yaml", ".yml")):
            objects += [doc for doc in yaml.safe_load_all(files[path]) if doc]
    return objects


def _strip_helm_labels(node: Any) -> None:
    if isinstance(node, dict):
        labels = node.get("labels")
        if isinstance(labels, dict):
            for key in HELM_ONLY_LABELS:
                labels.pop(key, None)
        for value in node.values():
            _strip_helm_labels(value)
    elif isinstance(node, list):
        for item in node:
            _strip_helm_labels(item)


def _kind_rank(obj: Obj) -> int:
    kind = obj["kind"]
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def plain_install_objects() -> list[Obj]:
    """The objects manifests/operator.yaml must hold (in apply order)."""
    namespace: Obj = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {
            "name": PLAIN_NAMESPACE,
            "labels": {"app.kubernetes.io/part-of": "radixserve"},
        },
    }
    objects = [namespace, *render_objects()]
    for obj in objects:
        _strip_helm_labels(obj)
    return sorted(objects, key=_kind_rank)


def plain_install_yaml() -> str:
    header = (
        "# The radixserve operator without Helm: namespace, ServiceAccount, RBAC, Deployment.\n"
        "# Generated from charts/radixserve (default values) by tests/deploy/render.py.\n"
        "#   kubectl apply -f manifests/crds/ && kubectl apply -f manifests/operator.yaml\n"
    )
    body = yaml.safe_dump_all(plain_install_objects(), sort_keys=False, default_flow_style=False)
    return header + body


def load_yaml_documents(path: Path) -> list[Obj]:
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def main() -> int:
    PLAIN_INSTALL.write_text(plain_install_yaml())
    print(f"wrote {PLAIN_INSTALL.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
