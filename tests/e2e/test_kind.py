"""End to end on kind: the chart's operator turns manifests/examples/smollm2-cpu.yaml into a
routed, cache-aware endpoint; it scales with `kubectl scale`; deleting it collects every child.

The tests share one InferenceService and run in file order (ready → traffic → scale → delete).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.e2e.kind import REPO, Cluster, port_forward, wait_for

pytestmark = pytest.mark.e2e

EXAMPLE = REPO / "manifests" / "examples" / "smollm2-cpu.yaml"
NAME, MODEL = "smollm2", "smollm2-135m"
READY_TIMEOUT = float(os.environ.get("RADIXSERVE_E2E_READY_TIMEOUT", "900"))


@dataclass(frozen=True)
class Served:
    cluster: Cluster
    namespace: str
    uid: str

    def isvc(self) -> dict[str, Any]:
        obj = self.cluster.get(self.namespace, "isvc", NAME)
        assert obj is not None, "the InferenceService vanished"
        return obj

    def diagnostics(self) -> str:
        return self.cluster.diagnostics(self.namespace)


def _condition(obj: dict[str, Any], kind: str) -> str | None:
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if cond.get("type") == kind:
            return cond.get("status")
    return None


def _settled(obj: dict[str, Any], replicas: int) -> bool:
    status = obj.get("status") or {}
    return (
        _condition(obj, "Ready") == "True"
        and status.get("observedGeneration") == obj["metadata"]["generation"]
        and status.get("readyReplicas") == replicas
    )


def _ready_endpoints(served: Served, service: str) -> int:
    slices = served.cluster.get(
        served.namespace, "endpointslices", "-l", f"kubernetes.io/service-name={service}"
    )
    endpoints = [e for s in (slices or {}).get("items", []) for e in s.get("endpoints") or []]
    return sum(1 for e in endpoints if (e.get("conditions") or {}).get("ready"))


def _owned_children(served: Served) -> list[tuple[str, str]]:
    """(kind, name) of every object in the namespace whose controller is our InferenceService."""
    owned = []
    for kind in ("deployments", "services", "serviceaccounts", "roles", "rolebindings"):
        for obj in (served.cluster.get(served.namespace, kind) or {}).get("items", []):
            refs = obj["metadata"].get("ownerReferences") or []
            if any(r["uid"] == served.uid and r.get("controller") for r in refs):
                owned.append((obj["kind"], obj["metadata"]["name"]))
    return owned


@pytest.fixture(scope="module")
def served(kind_cluster: Cluster) -> Iterator[Served]:
    namespace = f"radixserve-e2e-{secrets.token_hex(3)}"
    kind_cluster.kubectl("create", "namespace", namespace)
    try:
        kind_cluster.kubectl("apply", "-n", namespace, "-f", str(EXAMPLE))
        isvc = kind_cluster.get(namespace, "isvc", NAME)
        assert isvc is not None
        yield Served(kind_cluster, namespace, isvc["metadata"]["uid"])
    finally:
        kind_cluster.kubectl("delete", "namespace", namespace, "--wait=false", check=False)


@pytest.fixture(scope="module")
def base_url(served: Served) -> Iterator[str]:
    """The router Service `smollm2`, port-forwarded once a router pod runs (Ready)."""
    wait_for("Ready", lambda: _condition(served.isvc(), "Ready") == "True", READY_TIMEOUT)
    service = served.cluster.get(served.namespace, "service", NAME)
    assert service is not None
    port = next(p["port"] for p in service["spec"]["ports"] if p.get("name") == "http")
    with port_forward(served.cluster, served.namespace, NAME, port) as local:
        yield f"http://127.0.0.1:{local}"


def _client(base_url: str) -> Any:
    from openai import OpenAI

    return OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=5, timeout=120)


def test_becomes_ready_with_owned_children(served: Served) -> None:
    from radixserve.operator.builders import child_refs  # the operator's own list of children
    from radixserve.operator.meta import service_url

    wait_for(
        "Ready with 2 engine replicas",
        lambda: _settled(served.isvc(), 2),
        READY_TIMEOUT,
        served.diagnostics,
    )
    isvc = served.isvc()
    assert isvc["status"]["url"] == service_url(NAME, served.namespace)
    for cond in ("EngineReady", "RouterReady"):
        assert _condition(isvc, cond) == "True", cond
    assert _condition(isvc, "Degraded") != "True"
    expected = {(kind, name) for _, kind, name in child_refs(NAME)}
    assert set(_owned_children(served)) == expected
    headless = served.cluster.get(served.namespace, "service", f"{NAME}-engine")
    assert headless is not None and headless["spec"]["clusterIP"] == "None"
    ports = {p["name"]: p["port"] for p in headless["spec"]["ports"]}
    assert (ports["http"], ports["kv-events"], ports["kv-replay"]) == (30000, 5557, 5558)
    assert _ready_endpoints(served, f"{NAME}-engine") == 2


def test_chat_through_the_router(base_url: str) -> None:
    client = _client(base_url)
    assert MODEL in [m.id for m in client.models.list().data]
    reply = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "What is the capital of France?"}],
        max_tokens=16,
        temperature=0,
    )
    assert reply.choices[0].message.content
    assert reply.usage is not None and reply.usage.prompt_tokens > 0
    stream = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Count to five."}],
        max_tokens=16,
        stream=True,
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_repeated_prefixes_hit_the_cache(base_url: str) -> None:
    """Cache-aware routing: a repeated long prompt goes back to the replica that cached it."""
    client = _client(base_url)
    for topic in ("rivers", "mountains", "deserts", "forests"):
        system = f"You are a geography teacher. Answer questions about {topic}. " * 20
        messages = [
            {"role": "system", "content": system},
            {"role": "user", "content": f"Name one famous example of {topic}."},
        ]
        first = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        time.sleep(1)  # the router learns the new blocks from the engine's KV events
        again = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=4)
        assert first.usage is not None and again.usage is not None
        details = again.usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else 0
        assert cached and cached >= again.usage.prompt_tokens // 2, (topic, again.usage)


def test_kubectl_scale_adds_a_replica(served: Served, base_url: str) -> None:
    served.cluster.kubectl("scale", "-n", served.namespace, f"isvc/{NAME}", "--replicas", "3")
    wait_for(
        "Ready with 3 engine replicas",
        lambda: _settled(served.isvc(), 3),
        READY_TIMEOUT,
        served.diagnostics,
    )
    engine = served.cluster.get(served.namespace, "deployment", f"{NAME}-engine")
    assert engine is not None and engine["spec"]["replicas"] == 3
    assert served.isvc()["spec"]["engine"]["replicas"] == 3
    wait_for(
        "3 ready engine endpoints", lambda: _ready_endpoints(served, f"{NAME}-engine") == 3, 60
    )
    client = _client(base_url)
    for i in range(6):
        reply = client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": f"Say {i}."}], max_tokens=4
        )
        assert reply.choices[0].message.content is not None


def test_delete_collects_every_child(served: Served) -> None:
    from radixserve.operator.config import LABEL_INSTANCE

    children = _owned_children(served)
    assert len(children) >= 5
    served.cluster.kubectl("delete", "-n", served.namespace, f"isvc/{NAME}", "--timeout=180s")

    def gone() -> bool:
        left = [c for c in children if served.cluster.get(served.namespace, c[0], c[1])]
        pods = served.cluster.get(served.namespace, "pods", "-l", f"{LABEL_INSTANCE}={NAME}")
        return not left and not (pods or {}).get("items")

    wait_for("children and pods to be garbage-collected", gone, 240, served.diagnostics)
    assert served.cluster.get(served.namespace, "isvc", NAME) is None
