"""The prefill/decode InferenceService the operator renders really runs: the PD example
(`manifests/examples/smollm2-pd.yaml`) through the operator's own spec parser and builders,
then as processes on 127.0.0.1, as `test_rendered_stack.py` runs the co-located examples:
- each prefill and decode pod runs its container's command and args as rendered (only the
  port numbers moved to free ones: HTTP, KV events, the prefill's bootstrap port);
- kmock serves the EndpointSlices of the two rendered headless Services (prefill, decode);
- the router runs its rendered args (`--pd-disaggregation --k8s-prefill-service ...
  --k8s-decode-service ... --k8s-bootstrap-port ...`), so it finds each pool by its Service;
- every probe of every container answers; chat through the router works, each request's KV
  moves from the prefill to a decode pod, and later turns hit the prefill's cache.
The KV moves over Mooncake's TransferEngine (TCP), between real processes."""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest

from tests.child_env import child_env
from tests.ports import free_port
from tests.router.test_k8s_discovery import write_kubeconfig
from tests.stack.test_rendered_stack import (
    PROBES,
    ApiServer,
    Case,
    Proc,
    container,
    endpoint_slice,
    localize,
    named_ports,
    pod_ports,
    rendered,
    wait_for,
)

pytestmark = pytest.mark.slow

CASE = Case(
    "smollm2-pd.yaml",
    "smollm2-135m",
    "You are a terse assistant for a shipping company. " * 12,
    ("Where is my parcel?", "Can I change the address?", "Do you ship abroad?"),
)


def _pool(
    dep: dict[str, Any], svc: dict[str, Any], env: dict[str, str], tmp: Path, role: str
) -> tuple[dict[str, Any], list[Proc], list[dict[str, int]], list[dict[str, Any]]]:
    """Start the rendered pods of one pool; (container, procs, local ports, slices)."""
    c = container(dep)
    ports = named_ports(c)
    procs, pods = [], []
    for i in range(dep["spec"]["replicas"]):
        pod = pod_ports({k: v for k, v in ports.items() if k != "bootstrap"})
        moves = {
            "--port": (ports["http"], pod["http"]),
            "--kv-events-port": (ports["kv-events"], pod["kv-events"]),
        }
        if "bootstrap" in ports:
            pod["bootstrap"] = free_port()
            moves["--disaggregation-bootstrap-port"] = (ports["bootstrap"], pod["bootstrap"])
        args = localize(c["args"], moves)
        pod_env = {**env, **{e["name"]: e["value"] for e in c.get("env", []) if "value" in e}}
        procs.append(Proc([*c["command"], *args], tmp / f"{role}-{i}.log", pod_env))
        pods.append(pod)
    slices = [endpoint_slice(svc, pod, i) for i, pod in enumerate(pods)]
    return c, procs, pods, slices


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("pd-stack")
    name, objs = rendered(CASE, tmp)
    env = child_env({"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    env.pop("KUBERNETES_SERVICE_HOST", None)
    pools = {
        role: _pool(
            objs[f"Deployment/{name}-{role}"], objs[f"Service/{name}-{role}"], env, tmp, role
        )
        for role in ("prefill", "decode")
    }
    procs = [p for _, ps, _, _ in pools.values() for p in ps]
    (prefill_pod,) = pools["prefill"][2]  # the example's one prefill: its bootstrap port
    rc = container(objs[f"Deployment/{name}-router"])
    router_port = free_port()
    args = localize(
        rc["args"],
        {
            "--port": (named_ports(rc)["http"], router_port),
            "--k8s-bootstrap-port": (8998, prefill_pod["bootstrap"]),
        },
    )
    try:
        for _, ps, pods, _ in pools.values():
            for proc, pod in zip(ps, pods, strict=True):
                wait_for(f"http://127.0.0.1:{pod['http']}/health", proc)
        slices = [s for _, _, _, pool_slices in pools.values() for s in pool_slices]
        with ApiServer(slices) as api:
            kubeconfig = tmp / "kubeconfig"
            write_kubeconfig(kubeconfig, api.url)
            router = Proc(
                [*rc["command"], *args], tmp / "router.log", {**env, "KUBECONFIG": str(kubeconfig)}
            )
            try:
                wait_for(f"http://127.0.0.1:{router_port}/readiness", router, 60)
                yield {"pools": pools, "router": (rc, {"http": router_port}), "proc": router}
            finally:
                router.stop()
    finally:
        for proc in procs:
            proc.stop()


def test_every_probe_path_answers(stack: dict[str, Any]) -> None:
    rc, router_ports = stack["router"]
    sets = [(c, pods) for c, _, pods, _ in stack["pools"].values()] + [(rc, [router_ports])]
    for c, port_sets in sets:
        for probe in PROBES:
            if probe not in c:
                continue
            get = c[probe]["httpGet"]
            for local in port_sets:
                resp = httpx.get(f"http://127.0.0.1:{local[get['port']]}{get['path']}", timeout=5)
                assert resp.status_code == 200, (c["name"], probe, resp.text)


def _transfers(pods: list[dict[str, int]]) -> int:
    loads = [httpx.get(f"http://127.0.0.1:{p['http']}/get_load", timeout=10).json() for p in pods]
    return sum(load["kv_transfers_total"] for load in loads)


def test_chat_goes_prefill_to_decode_and_later_turns_hit_the_prefills_cache(
    stack: dict[str, Any],
) -> None:
    _, router_ports = stack["router"]
    prefill_pods, decode_pods = stack["pools"]["prefill"][2], stack["pools"]["decode"][2]
    before = (_transfers(prefill_pods), _transfers(decode_pods))
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{router_ports['http']}/v1", api_key="none")
    usages = []
    for question in CASE.questions:
        out = client.chat.completions.create(
            model=CASE.model,
            messages=[
                {"role": "system", "content": CASE.system},
                {"role": "user", "content": question},
            ],
            max_tokens=4,
            temperature=0,
        )
        assert out.choices[0].message.content is not None
        usages.append(out.usage)
    n = len(CASE.questions)
    assert (_transfers(prefill_pods), _transfers(decode_pods)) == (before[0] + n, before[1] + n)
    assert usages[0].prompt_tokens > 100
    for usage in usages[1:]:  # the prefill served the shared system prompt from its cache
        assert usage.prompt_tokens_details.cached_tokens >= 100, usages
