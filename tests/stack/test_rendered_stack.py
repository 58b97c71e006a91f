"""The manifests the operator writes really start a working stack.

The example InferenceService `manifests/examples/smollm2-cpu.yaml` goes through the operator's
own spec parser and builders. Then, as processes on 127.0.0.1:
- each engine replica runs the engine container's command and args as rendered (only the
  port numbers are moved to free ones, and only where the args name the container's ports);
- a Kubernetes API (kmock) serves the EndpointSlices the EndpointSlice controller would make
  for the rendered headless Service (its named ports resolved against the engine pods);
- the router runs its container's command and args as rendered, so it finds the engines
  through `--k8s-service` and their KV-event streams through the named ports;
- every startup/readiness/liveness probe of both containers answers 200 on its path;
- chat requests through the router work, and a repeated prefix is served from the cache.
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import kmock
import openai
import pytest
import yaml

from radixserve.operator.builders import build_children
from radixserve.operator.config import OperatorConfig
from radixserve.operator.meta import Owner
from radixserve.operator.spec import parse_spec
from tests.engine.server.live_server import free_port, free_port_pair
from tests.router.test_k8s_discovery import SliceEmulator, write_kubeconfig

EXAMPLE = Path(__file__).parents[2] / "manifests" / "examples" / "smollm2-cpu.yaml"
NAMESPACE = "llm"
STARTUP_TIMEOUT_S = 300
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


def rendered() -> dict[str, dict[str, Any]]:
    doc = yaml.safe_load(EXAMPLE.read_text())
    name = doc["metadata"]["name"]
    spec = parse_spec(doc["spec"], name)
    children = build_children(Owner(name, NAMESPACE, "uid-1"), spec, OperatorConfig())
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in children}


def container(deployment: dict[str, Any]) -> dict[str, Any]:
    (only,) = deployment["spec"]["template"]["spec"]["containers"]
    return only


def localize(args: list[str], flag_ports: dict[str, tuple[int, int]]) -> list[str]:
    """Move `--flag <containerPort>` to a local port; the rendered value must be the port."""
    out = list(args)
    for flag, (container_port, local) in flag_ports.items():
        i = out.index(flag)
        assert out[i + 1] == str(container_port), f"{flag} disagrees with the container port"
        out[i + 1] = str(local)
    return out


def named_ports(c: dict[str, Any]) -> dict[str, int]:
    return {p["name"]: p["containerPort"] for p in c["ports"]}


class Proc:
    def __init__(self, cmd: list[str], log: Path, env: dict[str, str]) -> None:
        self.log = log
        with log.open("wb") as f:
            self.proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, cwd="/tmp", env=env
            )

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:]

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(2)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def wait_for(url: str, proc: Proc, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.proc.poll() is None, f"exited during start-up:\n{proc.tail()}"
        try:
            if httpx.get(url, timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise AssertionError(f"{url} not 200 after {timeout}s:\n{proc.tail()}")


def endpoint_slice(service: dict[str, Any], pod_ports: dict[str, int], i: int) -> dict[str, Any]:
    """What the EndpointSlice controller writes for one ready pod of a selector Service."""
    ports = [
        {"name": p["name"], "port": pod_ports[p["targetPort"]], "protocol": p["protocol"]}
        for p in service["spec"]["ports"]
    ]
    name = service["metadata"]["name"]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{name}-{i}",
            "namespace": NAMESPACE,
            "labels": {"kubernetes.io/service-name": name},
        },
        "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
        "ports": ports,
    }


class ApiServer:
    """kmock serving EndpointSlices on a real port, in a thread with its own event loop."""

    def __init__(self, slices: list[dict[str, Any]]) -> None:
        self.slices = slices
        self.url = ""
        self._ready = threading.Event()
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._serve()), daemon=True)

    async def _serve(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        async with SliceEmulator() as emulator, kmock.Server(emulator) as server:
            emulator.resources["discovery.k8s.io/v1/endpointslices"] = {
                "kind": "EndpointSlice",
                "namespaced": True,
            }
            path = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"
            for obj in self.slices:
                async with emulator.post(path, json=obj) as resp:
                    assert resp.status == 200, await resp.text()
            self.url = str(server.url).rstrip("/")
            self._ready.set()
            await self._stop.wait()

    def __enter__(self) -> ApiServer:
        self._thread.start()
        assert self._ready.wait(30), "kmock did not start"
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._loop is not None and self._stop is not None
        self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(10)


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    objs = rendered()
    name = yaml.safe_load(EXAMPLE.read_text())["metadata"]["name"]
    engine_dep, router_dep = objs[f"Deployment/{name}-engine"], objs[f"Deployment/{name}-router"]
    engine_svc = objs[f"Service/{name}-engine"]
    tmp = tmp_path_factory.mktemp("stack")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    env.pop("KUBERNETES_SERVICE_HOST", None)
    ec = container(engine_dep)
    ports = named_ports(ec)
    engines, pods = [], []
    for i in range(engine_dep["spec"]["replicas"]):
        http, kv = free_port(), free_port_pair()
        pod = {"http": http, "kv-events": kv, "kv-replay": kv + 1}
        args = localize(
            ec["args"],
            {"--port": (ports["http"], http), "--kv-events-port": (ports["kv-events"], kv)},
        )
        assert ports["kv-replay"] == ports["kv-events"] + 1  # the engine binds replay at +1
        pod_env = {**env, **{e["name"]: e["value"] for e in ec.get("env", []) if "value" in e}}
        engines.append(Proc([*ec["command"], *args], tmp / f"engine-{i}.log", pod_env))
        pods.append(pod)
    slices = [endpoint_slice(engine_svc, pod, i) for i, pod in enumerate(pods)]
    rc = container(router_dep)
    router_port = free_port()
    router_ports = {"http": router_port}
    args = localize(rc["args"], {"--port": (named_ports(rc)["http"], router_port)})
    try:
        for proc, pod in zip(engines, pods, strict=True):
            wait_for(f"http://127.0.0.1:{pod['http']}/health", proc)
        with ApiServer(slices) as api:
            kubeconfig = tmp / "kubeconfig"
            write_kubeconfig(kubeconfig, api.url)
            router = Proc(
                [*rc["command"], *args], tmp / "router.log", {**env, "KUBECONFIG": str(kubeconfig)}
            )
            try:
                wait_for(f"http://127.0.0.1:{router_port}/readiness", router, 60)
                yield {"engines": (ec, pods), "router": (rc, router_ports), "proc": router}
            finally:
                router.stop()
    finally:
        for proc in engines:
            proc.stop()


def test_every_probe_path_answers(stack: dict[str, Any]) -> None:
    ec, pods = stack["engines"]
    rc, router_ports = stack["router"]
    for c, port_sets in ((ec, pods), (rc, [router_ports])):
        for probe in PROBES:
            if probe not in c:
                continue
            get = c[probe]["httpGet"]
            for local in port_sets:
                resp = httpx.get(f"http://127.0.0.1:{local[get['port']]}{get['path']}", timeout=5)
                assert resp.status_code == 200, (c["name"], probe, resp.text)


def test_router_found_every_engine_and_its_kv_events(stack: dict[str, Any]) -> None:
    _, pods = stack["engines"]
    _, router_ports = stack["router"]
    metrics = httpx.get(f"http://127.0.0.1:{router_ports['http']}/metrics").text
    for pod in pods:
        worker = f'worker="http://127.0.0.1:{pod["http"]}"'
        healthy = [
            line for line in metrics.splitlines() if "worker_healthy{" in line and worker in line
        ]
        assert healthy and healthy[0].endswith(" 1.0"), metrics
        mirrors = [
            line for line in metrics.splitlines() if "mirror_tokens{" in line and worker in line
        ]
        assert mirrors and 'mode="events"' in mirrors[0], metrics


def test_chat_through_the_router_reuses_the_cache(stack: dict[str, Any]) -> None:
    _, router_ports = stack["router"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{router_ports['http']}/v1", api_key="none")
    system = "You are a terse assistant for a shipping company. " * 12
    usages = []
    for question in ("Where is my parcel?", "Can I change the address?", "Do you ship abroad?"):
        out = client.chat.completions.create(
            model="smollm2-135m",
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=4,
            temperature=0,
        )
        assert out.choices[0].message.content is not None
        usages.append(out.usage)
    assert usages[0].prompt_tokens > 100
    # the router sent the later turns where the system prompt is cached
    for usage in usages[1:]:
        cached = usage.prompt_tokens_details.cached_tokens
        assert cached >= 100, usages
