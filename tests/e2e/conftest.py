"""The kind cluster for the e2e suite: created (or reused), images built and loaded, chart
installed. Skips, naming what is missing, where kind, docker, kubectl or helm cannot run.

Environment: RADIXSERVE_E2E_CLUSTER (kind cluster name, default radixserve-e2e),
RADIXSERVE_E2E_TAG (image tag, default e2e), RADIXSERVE_E2E_KEEP=1 (keep a cluster this run
created), RADIXSERVE_E2E_NODE_IMAGE (kindest/node image), RADIXSERVE_E2E_READY_TIMEOUT (s).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.kind import (
    Cluster,
    build_and_load_images,
    delete_cluster,
    ensure_cluster,
    helm_install,
    missing_prerequisites,
)


@pytest.fixture(scope="session")
def kind_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    problems = missing_prerequisites()
    if problems:
        pytest.skip("e2e on kind needs kind, docker, kubectl and helm: " + "; ".join(problems))
    name = os.environ.get("RADIXSERVE_E2E_CLUSTER", "radixserve-e2e")
    tag = os.environ.get("RADIXSERVE_E2E_TAG", "e2e")
    kubeconfig = Path(tmp_path_factory.mktemp("kind")) / "kubeconfig"
    cluster, created = ensure_cluster(name, kubeconfig)
    try:
        build_and_load_images(cluster, tag)
        helm_install(cluster, tag)
        yield cluster
    finally:
        if created and os.environ.get("RADIXSERVE_E2E_KEEP") != "1":
            delete_cluster(cluster)
