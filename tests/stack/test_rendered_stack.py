"""The manifests the operator writes really start a working stack.

Two example InferenceServices go through the operator's own spec parser and builders:
`manifests/examples/smollm2-hicache-mooncake.yaml` as it is (smollm2-cpu.yaml plus a host tier
and a Mooncake store as the storage tier, `kvCache.offload`, whose master the operator runs),
and
`manifests/examples/deepseek-v2-lite-dp-ep.yaml` (DP attention + expert parallelism, the layout
made for MLA) with a tiny random-weight DeepSeek-V3 (MLA, grouped top-k MoE) made in the test
in place of the 16B checkpoint (a hostPath source),
on the CPU at tp=2, dp=2, ep=2 with one replica (the rendered `--enable-dp-attention`,
per-rank KV-event ports and all). Then, as processes on 127.0.0.1:
- the operator's Mooncake master, where one is rendered, runs its container's command and args
  (its two ports moved to free ones), and the engines' `master_server_address`, the master
  Service's name and port, becomes that local port;
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
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import kmock
import openai
import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from radixserve.operator.builders import build_children
from radixserve.operator.config import OperatorConfig
from radixserve.operator.engine_manifests import HICACHE_DIR
from radixserve.operator.meta import Owner
from radixserve.operator.spec import parse_spec
from tests.child_env import child_env
from tests.ports import free_port, free_port_run
from tests.router.test_k8s_discovery import SliceEmulator, write_kubeconfig

EXAMPLES = Path(__file__).parents[2] / "manifests" / "examples"
NAMESPACE = "llm"
STARTUP_TIMEOUT_S = 300
PROBES = ("startupProbe", "readinessProbe", "livenessProbe")


@dataclass(frozen=True)
class Case:
    """One example InferenceService as the test runs it."""

    example: str
    model: str  # the served model name chat requests use
    system: str  # a long system prompt the later turns find cached
    questions: tuple[str, ...]
    adapt: Callable[[dict[str, Any], Path], dict[str, Any]] | None = None  # spec → runnable here


def tiny_moe_on_cpu(spec: dict[str, Any], tmp: Path) -> dict[str, Any]:
    """The DP-attention + EP example at a size this machine runs: a tiny DeepSeek-V3 from a
    hostPath, the CPU instead of 4 GPUs, tp=2 / dp=2 / ep=2, one replica, a small KV pool."""
    from tests.reliability.conftest import save_tiny_checkpoint

    folder = save_tiny_checkpoint(tmp / "deepseek-v3-tiny", "deepseek_v3")
    engine = spec["engine"]
    for key in ("device", "nodeSelector", "tolerations"):
        engine.pop(key, None)
    engine["replicas"] = 1
    engine["resources"] = {"cpu": "1", "memory": "2Gi"}
    engine["parallelism"] = {"tp": 2, "dp": 2, "ep": 2, "dpAttention": True}
    engine["kvCache"] = {"pageSize": 16, "maxTotalTokens": 4096}
    engine["scheduler"] = {**engine["scheduler"], "chunkedPrefillSize": 64}
    return {**spec, "model": {**spec["model"], "source": {"hostPath": str(folder)}}}


CASES = {
    "smollm2": Case(
        "smollm2-hicache-mooncake.yaml",
        "smollm2-135m",
        "You are a terse assistant for a shipping company. " * 12,
        ("Where is my parcel?", "Can I change the address?", "Do you ship abroad?"),
    ),
    "mla-dp-ep": Case(
        "deepseek-v2-lite-dp-ep.yaml",
        "deepseek-v2-lite-chat",
        " ".join(f"t{2 + i % 50}" for i in range(120)),  # the word-level tokenizer's words
        ("t7 t8 t9", "t10 t11", "t12 t13 t14 t15"),
        tiny_moe_on_cpu,
    ),
}


def rendered(case: Case, tmp: Path) -> tuple[str, dict[str, dict[str, Any]]]:
    doc = yaml.safe_load((EXAMPLES / case.example).read_text())
    name = doc["metadata"]["name"]
    raw = case.adapt(doc["spec"], tmp) if case.adapt is not None else doc["spec"]
    spec = parse_spec(raw, name)
    children = build_children(Owner(name, NAMESPACE, "uid-1"), spec, OperatorConfig())
    return name, {f"{c['kind']}/{c['metadata']['name']}": c for c in children}


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
        time.sleep(0.2)
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


def pod_ports(container_ports: dict[str, int]) -> dict[str, int]:
    """Local ports for one engine pod's named container ports: http, then each DP rank's
    kv-events / kv-replay pair at P + 2r / P + 2r + 1 (the engine's rule)."""
    ranks = sum(1 for name in container_ports if name.startswith("kv-events"))
    kv = free_port_run(2 * ranks)
    out = {"http": free_port()}
    for rank in range(ranks):
        suffix = f"-{rank}" if rank else ""
        out[f"kv-events{suffix}"], out[f"kv-replay{suffix}"] = kv + 2 * rank, kv + 2 * rank + 1
        assert container_ports[f"kv-events{suffix}"] == container_ports["kv-events"] + 2 * rank
        assert container_ports[f"kv-replay{suffix}"] == container_ports[f"kv-events{suffix}"] + 1
    return out


@pytest.fixture(scope="module", params=sorted(CASES))
def stack(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Any]]:
    case = CASES[request.param]
    tmp = tmp_path_factory.mktemp("stack")
    name, objs = rendered(case, tmp)
    engine_dep, router_dep = objs[f"Deployment/{name}-engine"], objs[f"Deployment/{name}-router"]
    engine_svc = objs[f"Service/{name}-engine"]
    env = child_env({"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    env.pop("KUBERNETES_SERVICE_HOST", None)
    ec = container(engine_dep)
    ports = named_ports(ec)
    master = start_master(objs, name, tmp, env)
    engines, pods = [], []
    for i in range(engine_dep["spec"]["replicas"]):
        pod = pod_ports(ports)
        args = localize(
            ec["args"],
            {
                "--port": (ports["http"], pod["http"]),
                "--kv-events-port": (ports["kv-events"], pod["kv-events"]),
            },
        )
        # the storage tier's mount (an emptyDir per pod) becomes a folder of this pod's own
        store = json.dumps(str(tmp / f"hicache-{i}"))
        args = [a.replace(json.dumps(HICACHE_DIR), store) for a in args]
        if master is not None:  # the master Service's address, as the pod resolves it
            args = [a.replace(master[1], master[2]) for a in args]
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
                yield {
                    "engines": (ec, pods),
                    "router": (rc, router_ports),
                    "proc": router,
                    "case": case,
                }
            finally:
                router.stop()
    finally:
        for proc in engines:
            proc.stop()
        if master is not None:
            master[0].stop()


def start_master(
    objs: dict[str, dict[str, Any]], name: str, tmp: Path, env: dict[str, str]
) -> tuple[Proc, str, str] | None:
    """The rendered Mooncake master, if any, on free ports: (its process, the address the
    engines were rendered with, the local address that stands for it)."""
    deployment = objs.get(f"Deployment/{name}-mooncake")
    if deployment is None:
        return None
    service = objs[f"Service/{name}-mooncake"]
    mc = container(deployment)
    local = {port: free_port() for port in named_ports(mc).values()}
    args = []
    for arg in mc["args"]:
        flag, _, value = arg.partition("=")
        args.append(
            f"{flag}={local[int(value)]}" if value.isdigit() and int(value) in local else arg
        )
    proc = Proc([*mc["command"], *args], tmp / "mooncake-master.log", env)
    rpc = next(p for p in service["spec"]["ports"] if p["name"] == "rpc")
    rendered = f"{service['metadata']['name']}:{rpc['port']}"
    rpc_local = local[named_ports(mc)[rpc["targetPort"]]]
    deadline = time.monotonic() + 30
    while True:  # up when its RPC port accepts a connection
        assert proc.proc.poll() is None, f"the master exited:\n{proc.tail()}"
        try:
            socket.create_connection(("127.0.0.1", rpc_local), timeout=1).close()
            break
        except OSError:
            assert time.monotonic() < deadline, proc.tail()
            time.sleep(0.2)
    return proc, rendered, f"127.0.0.1:{rpc_local}"


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


def test_the_engine_ran_the_rendered_layout(stack: dict[str, Any]) -> None:
    """The engine serves with the parallel layout the operator rendered into its args."""
    ec, pods = stack["engines"]
    args = ec["args"]
    for pod in pods:
        info = httpx.get(f"http://127.0.0.1:{pod['http']}/server_info", timeout=10).json()
        for flag, key in (
            ("--tp-size", "tp_size"),
            ("--dp-size", "dp_size"),
            ("--ep-size", "ep_size"),
        ):
            want = int(args[args.index(flag) + 1]) if flag in args else 1
            assert info[key] == want, (flag, info)
        assert info["enable_dp_attention"] == ("--enable-dp-attention" in args)
        assert len(info["kv_events"]) == info["dp_size"]


def test_router_follows_every_dp_rank(stack: dict[str, Any]) -> None:
    """One mirror per (engine, DP rank), each fed by events: the DP-attention pod's two DP
    ranks publish on their own named ports and the router's discovery follows both."""
    ec, pods = stack["engines"]
    _, router_ports = stack["router"]
    ranks = sum(1 for p in ec["ports"] if p["name"].startswith("kv-events"))
    metrics = httpx.get(f"http://127.0.0.1:{router_ports['http']}/metrics").text
    for pod in pods:
        worker = f'worker="http://127.0.0.1:{pod["http"]}"'
        mirrors = [
            line for line in metrics.splitlines() if "mirror_tokens{" in line and worker in line
        ]
        assert len(mirrors) == ranks and all('mode="events"' in m for m in mirrors), metrics


def test_chat_through_the_router_reuses_the_cache(stack: dict[str, Any]) -> None:
    case: Case = stack["case"]
    _, router_ports = stack["router"]
    client = openai.OpenAI(base_url=f"http://127.0.0.1:{router_ports['http']}/v1", api_key="none")
    usages = []
    for question in case.questions:
        out = client.chat.completions.create(
            model=case.model,
            messages=[
                {"role": "system", "content": case.system},
                {"role": "user", "content": question},
            ],
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


def test_the_engine_runs_the_rendered_kv_offload(stack: dict[str, Any]) -> None:
    """kvCache.offload reached the engine: its host tier has the rendered size (the ratio
    times the KV pool) and reports on /metrics."""
    ec, pods = stack["engines"]
    if "--enable-hierarchical-cache" not in ec["args"]:
        pytest.skip("this example has no kvCache.offload")
    ratio = float(ec["args"][ec["args"].index("--hicache-ratio") + 1])
    for pod in pods:
        text = httpx.get(f"http://127.0.0.1:{pod['http']}/metrics", timeout=5).text
        values = {
            s.name: s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name.startswith("radixserve:hicache_host_total_tokens")
            or s.name == "radixserve:max_total_num_tokens"
        }
        host = values["radixserve:hicache_host_total_tokens"]
        assert host == ratio * 8192  # the example's maxTotalTokens


def test_the_replicas_share_the_operators_mooncake_store(stack: dict[str, Any]) -> None:
    """With a Mooncake storage tier, both replicas report the same storage id (the operator's
    master), and a prompt one replica computed is read from the store by the other."""
    ec, pods = stack["engines"]
    if "mooncake" not in ec["args"]:
        pytest.skip("this example has no Mooncake storage tier")
    ids = set()
    for pod in pods:
        info = httpx.get(f"http://127.0.0.1:{pod['http']}/server_info", timeout=5).json()
        ids |= {r["hicache_storage_id"] for r in info["dp_ranks"]}
    (only,) = ids
    assert only.startswith("mooncake:")
    prompt = " ".join(f"harbour{i} tide{i % 7}" for i in range(160))  # > 256 tokens
    body = {"text": prompt, "sampling_params": {"max_new_tokens": 1, "temperature": 0}}
    first = httpx.post(f"http://127.0.0.1:{pods[0]['http']}/generate", json=body, timeout=120)
    assert first.status_code == 200 and first.json()["meta_info"]["cached_tokens"] == 0
    deadline = time.monotonic() + 30
    while True:  # the first replica's writes land in the store in the background
        second = httpx.post(f"http://127.0.0.1:{pods[1]['http']}/generate", json=body, timeout=120)
        cached = second.json()["meta_info"]["cached_tokens"]
        if cached >= 256 or time.monotonic() > deadline:
            break
        httpx.post(f"http://127.0.0.1:{pods[1]['http']}/flush_cache", timeout=10)
        time.sleep(1)
    assert cached >= 256, second.json()["meta_info"]
