"""Kubernetes discovery: the pure slice → workers step, and the watch loop against kmock.

The integration tests run `watch_endpoint_slices` against kmock's Kubernetes emulator over real
HTTP (a kubeconfig points the client at it) with a real WorkerRegistry, and follow the
registry's workers through EndpointSlice creates, readiness changes, deletes and API faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import httpx
import kmock
import pytest

from radixserve.router.addresses import KVEndpoint
from radixserve.router.config import RouterConfig
from radixserve.router.k8s_discovery import (
    KV_REPLAY_PORT_NAME,
    SERVICE_LABEL,
    belongs_to,
    desired_workers,
    endpoint_ready,
    load_client_config,
    resolve_namespace,
    slice_workers,
    watch_endpoint_slices,
)
from radixserve.router.mirror.index import CacheIndex
from radixserve.router.workers import WorkerRegistry

SERVICE = "demo-engine"
CFG = RouterConfig(k8s_service=SERVICE)


def make_slice(
    name: str,
    endpoints: list[dict[str, Any]],
    ports: list[dict[str, Any]] | None = None,
    service: str = SERVICE,
    address_type: str = "IPv4",
) -> dict[str, Any]:
    if ports is None:
        ports = [{"name": "http", "port": 30000}, {"name": "kv-events", "port": 5557}]
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": name, "labels": {SERVICE_LABEL: service}},
        "addressType": address_type,
        "endpoints": endpoints,
        "ports": ports,
    }


def ep(address: str, ready: bool | None = True) -> dict[str, Any]:
    out: dict[str, Any] = {"addresses": [address]}
    if ready is not None:
        out["conditions"] = {"ready": ready}
    return out


# ---- pure function ------------------------------------------------------------------------


def test_readiness_follows_kube_proxy() -> None:
    assert endpoint_ready({"addresses": ["10.0.0.1"]})  # no conditions at all
    assert endpoint_ready({"addresses": ["10.0.0.1"], "conditions": {}})
    assert endpoint_ready({"conditions": {"ready": True}})
    assert not endpoint_ready({"conditions": {"ready": False, "serving": True}})


def test_ready_unready_and_missing_conditions() -> None:
    s = make_slice("s1", [ep("10.0.0.1", True), ep("10.0.0.2", False), ep("10.0.0.3", None)])
    assert set(slice_workers(s, CFG)) == {"http://10.0.0.1:30000", "http://10.0.0.3:30000"}


def test_kv_endpoints_from_named_ports() -> None:
    ports = [{"name": "kv-events", "port": 6000}, {"name": "http", "port": 8080}]
    w = slice_workers(make_slice("s", [ep("10.1.2.3")], ports), CFG)["http://10.1.2.3:8080"]
    # No kv-replay port: the replay socket is the next port, as the engine binds it.
    assert w.kv_override == (KVEndpoint(0, "tcp://10.1.2.3:6000", "tcp://10.1.2.3:6001"),)
    ports.append({"name": KV_REPLAY_PORT_NAME, "port": 7100})
    w = slice_workers(make_slice("s", [ep("10.1.2.3")], ports), CFG)["http://10.1.2.3:8080"]
    assert w.kv_override == (KVEndpoint(0, "tcp://10.1.2.3:6000", "tcp://10.1.2.3:7100"),)


def test_every_dp_ranks_kv_ports_are_followed() -> None:
    """The operator names rank r > 0's ports kv-events-<r> / kv-replay-<r>."""
    ports = [
        {"name": "http", "port": 8080},
        {"name": "kv-events", "port": 5557},
        {"name": "kv-replay", "port": 5558},
        {"name": "kv-events-1", "port": 5559},
        {"name": "kv-replay-1", "port": 5560},
        {"name": "kv-events-3", "port": 5563},  # rank 2 is missing: rank 3 is not followed
    ]
    w = slice_workers(make_slice("s", [ep("10.1.2.3")], ports), CFG)["http://10.1.2.3:8080"]
    assert w.kv_override == (
        KVEndpoint(0, "tcp://10.1.2.3:5557", "tcp://10.1.2.3:5558"),
        KVEndpoint(1, "tcp://10.1.2.3:5559", "tcp://10.1.2.3:5560"),
    )


def test_port_names_come_from_the_config() -> None:
    cfg = RouterConfig(k8s_service=SERVICE, k8s_http_port_name="api", k8s_kv_events_port_name="kv")
    ports = [
        {"name": "http", "port": 1},
        {"name": "api", "port": 9000},
        {"name": "kv-events", "port": 2},
        {"name": "kv", "port": 9100},
    ]
    got = slice_workers(make_slice("s", [ep("10.0.0.9")], ports), cfg)
    assert list(got) == ["http://10.0.0.9:9000"]
    assert got["http://10.0.0.9:9000"].kv_override == (
        KVEndpoint(0, "tcp://10.0.0.9:9100", "tcp://10.0.0.9:9101"),
    )


def test_no_kv_port_leaves_discovery_to_server_info() -> None:
    s = make_slice("s", [ep("10.0.0.1")], [{"name": "http", "port": 30000}])
    assert slice_workers(s, CFG)["http://10.0.0.1:30000"].kv_override is None


def test_missing_http_port_gives_no_workers() -> None:
    s = make_slice("s", [ep("10.0.0.1")], [{"name": "metrics", "port": 9090}])
    assert slice_workers(s, CFG) == {}
    assert slice_workers(make_slice("s", [ep("10.0.0.1")], []), CFG) == {}


def test_single_unnamed_port_is_the_http_port() -> None:
    s = make_slice("s", [ep("10.0.0.1")], [{"port": 8000}])
    assert list(slice_workers(s, CFG)) == ["http://10.0.0.1:8000"]


def test_ipv6_addresses_are_bracketed() -> None:
    s = make_slice("s6", [ep("fd00::1:2")], address_type="IPv6")
    w = slice_workers(s, CFG)["http://[fd00::1:2]:30000"]
    assert w.kv_override == (KVEndpoint(0, "tcp://[fd00::1:2]:5557", "tcp://[fd00::1:2]:5558"),)


def test_multiple_slices_and_multiple_addresses() -> None:
    a = make_slice("a", [ep("10.0.0.1"), {"addresses": ["10.0.0.2", "10.0.0.3"]}])
    b = make_slice("b", [ep("10.0.0.4"), ep("10.0.0.1", False)])  # moved: still ready in a
    c = make_slice("c", [ep("fd00::9")], address_type="IPv6")
    got = desired_workers([a, b, c], CFG)
    hosts = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4", "[fd00::9]"]
    assert set(got) == {f"http://{h}:30000" for h in hosts}
    assert desired_workers([], CFG) == {}


def test_belongs_to_checks_the_service_label() -> None:
    assert belongs_to(make_slice("a", []), SERVICE)
    assert not belongs_to(make_slice("a", [], service="other"), SERVICE)
    assert not belongs_to({"metadata": {"name": "x"}}, SERVICE)


def test_namespace_resolution(tmp_path: Path) -> None:
    ns_file = tmp_path / "namespace"
    assert resolve_namespace("explicit", str(ns_file)) == "explicit"
    assert resolve_namespace(None, str(ns_file)) == "default"  # no file: not in a pod
    ns_file.write_text("team-a\n")
    assert resolve_namespace(None, str(ns_file)) == "team-a"


def write_kubeconfig(path: Path, server: str) -> None:
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: kmock\n"
        f"clusters:\n- name: kmock\n  cluster:\n    server: {server}\n"
        "users:\n- name: kmock\n  user:\n    token: test-token\n"
        "contexts:\n- name: kmock\n  context:\n    cluster: kmock\n    user: kmock\n"
    )


def test_kubeconfig_is_read_from_env_at_call_time(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)  # not in a pod
    for server in ("http://127.0.0.1:1111", "http://127.0.0.1:2222"):
        path = tmp_path / f"kubeconfig-{server[-4:]}"
        write_kubeconfig(path, server)
        monkeypatch.setenv("KUBECONFIG", str(path))
        assert asyncio.run(load_client_config()).host == server


# ---- the watch loop against kmock ----------------------------------------------------------

NAMESPACE = "serving"
SLICES = f"/apis/discovery.k8s.io/v1/namespaces/{NAMESPACE}/endpointslices"


class Cluster:
    """kmock's emulator on a real port, and the calls a kubelet/controller would make to it."""

    def __init__(self, kmock: Any) -> None:
        self.kmock = kmock

    async def create(self, obj: dict[str, Any]) -> None:
        # kmock 0.8 does not fill metadata.namespace from the URL, and its namespaced watches
        # skip objects without one: set it as the API server would.
        obj = {**obj, "metadata": {**obj["metadata"], "namespace": NAMESPACE}}
        async with self.kmock.post(SLICES, json=obj) as resp:
            assert resp.status == 200, await resp.text()

    async def patch(self, name: str, patch: dict[str, Any]) -> None:
        headers = {"Content-Type": "application/merge-patch+json"}
        async with self.kmock.patch(f"{SLICES}/{name}", json=patch, headers=headers) as resp:
            assert resp.status == 200, await resp.text()

    async def delete(self, name: str) -> None:
        async with self.kmock.delete(f"{SLICES}/{name}") as resp:
            assert resp.status == 200, await resp.text()

    def requests(self, action: Any) -> int:
        """How many requests of this kind (a `kmock.action`) the API server has seen."""
        return len(self.kmock[action])


class SliceEmulator(kmock.KubernetesEmulator):  # type: ignore[misc]
    async def __call__(self, raw_request: Any) -> Any:
        # kubernetes_asyncio asks for `watch=True` (the API server's ParseBool accepts it);
        # kmock 0.8 only recognises `watch=true` and would answer a list instead.
        if raw_request.query.get("watch") == "True":
            url = raw_request.rel_url.update_query(watch="true")
            raw_request = raw_request.clone(rel_url=url)
        return await super().__call__(raw_request)


@contextlib.asynccontextmanager
async def running_discovery(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    initial: Sequence[dict[str, Any]] = (),
    faults: Callable[[Any], None] | None = None,
) -> AsyncIterator[tuple[Cluster, WorkerRegistry]]:
    """kmock (holding the `initial` slices) + a kubeconfig for it + a real WorkerRegistry +
    the discovery task."""
    cfg = RouterConfig(k8s_service=SERVICE, k8s_namespace=NAMESPACE)
    async with SliceEmulator() as emulator, kmock.Server(emulator) as server:
        emulator.resources["discovery.k8s.io/v1/endpointslices"] = {
            "kind": "EndpointSlice",
            "namespaced": True,
        }
        cluster = Cluster(emulator)
        for obj in initial:
            await cluster.create(obj)
        if faults is not None:
            faults(emulator)
        path = tmp_path / "kubeconfig"
        write_kubeconfig(path, str(server.url).rstrip("/"))
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(path))
        index = CacheIndex(approx_max_tokens=cfg.approx_max_tokens)
        await index.start()
        async with httpx.AsyncClient() as http:
            registry = WorkerRegistry(cfg, http, index)
            task = asyncio.create_task(watch_endpoint_slices(cfg, registry))
            try:
                yield cluster, registry
            finally:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
                await index.aclose()


def k8s_workers(registry: WorkerRegistry) -> dict[str, Any]:
    return {url: w.kv_override for url, w in registry.workers.items() if w.source == "k8s"}


async def until(
    registry: WorkerRegistry, want: set[str] | dict[str, Any], timeout: float = 10.0
) -> dict[str, Any]:
    """Wait for the k8s workers to be `want`: a set of URLs, or URL → kv_override."""
    deadline = time.monotonic() + timeout

    def now() -> Any:
        got = k8s_workers(registry)
        return got if isinstance(want, dict) else set(got)

    while now() != want:
        if time.monotonic() > deadline:
            raise AssertionError(f"k8s workers {now()} != {want}")
        await asyncio.sleep(0.02)
    return k8s_workers(registry)


def urls(*hosts: str) -> set[str]:
    return {f"http://{h}:30000" for h in hosts}


def test_registry_follows_creates_readiness_and_deletes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    async def scenario() -> None:
        # Slices that exist before discovery lists: ours, and one of another Service.
        initial = [
            make_slice("a", [ep("10.0.0.1"), ep("10.0.0.2", None)]),
            make_slice("other", [ep("10.9.9.9")], service="unrelated"),
        ]
        async with running_discovery(tmp_path, monkeypatch, initial) as (cluster, registry):
            static = registry.add("http://127.0.0.1:39999", source="static")
            got = await until(registry, urls("10.0.0.1", "10.0.0.2"))
            assert got["http://10.0.0.1:30000"] == (
                KVEndpoint(0, "tcp://10.0.0.1:5557", "tcp://10.0.0.1:5558"),
            )
            # A second slice (IPv6, no kv-events port) appears while watching.
            ports = [{"name": "http", "port": 30000}]
            v6 = make_slice("b", [ep("fd00::7")], ports, address_type="IPv6")
            await cluster.create(v6)
            got = await until(registry, urls("10.0.0.1", "10.0.0.2", "[fd00::7]"))
            assert got["http://[fd00::7]:30000"] is None
            # Its Service gains a kv-events port: the worker is re-added with KV endpoints.
            await cluster.patch("b", {"ports": [*ports, {"name": "kv-events", "port": 6000}]})
            kv6 = (KVEndpoint(0, "tcp://[fd00::7]:6000", "tcp://[fd00::7]:6001"),)
            await until(registry, {**got, "http://[fd00::7]:30000": kv6})
            # An endpoint turns unready, then ready again.
            await cluster.patch("a", {"endpoints": [ep("10.0.0.1"), ep("10.0.0.2", False)]})
            await until(registry, urls("10.0.0.1", "[fd00::7]"))
            await cluster.patch("a", {"endpoints": [ep("10.0.0.1"), ep("10.0.0.2", True)]})
            await until(registry, urls("10.0.0.1", "10.0.0.2", "[fd00::7]"))
            # Deleting a slice removes its endpoints; the other Service never counted.
            await cluster.delete("a")
            await until(registry, urls("[fd00::7]"))
            await cluster.delete("b")
            await until(registry, set())
            assert registry.workers == {static.url: static}  # a static worker is left alone
            # One list, then one watch that resumed from the list's resourceVersion and never broke.
            (listed,) = cluster.kmock[kmock.action.LIST]
            (watched,) = cluster.kmock[kmock.action.WATCH]
            selector = f"{SERVICE_LABEL}={SERVICE}"
            assert listed.params["labelSelector"] == watched.params["labelSelector"] == selector
            async with cluster.kmock.get(SLICES) as resp:
                version = (await resp.json())["metadata"]["resourceVersion"]
            assert watched.params["resourceVersion"] == version

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_api_failures_and_410_gone_lead_to_a_relist(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    gone = {"type": "ERROR", "object": {"kind": "Status", "code": 410, "reason": "Expired",
                                        "message": "too old resource version"}}  # fmt: skip

    def faults(emulator: Any) -> None:
        emulator[kmock.action.LIST][:1] << 503  # the first list fails outright
        emulator[kmock.action.WATCH][:1] << (gone,)  # the first watch expires at once

    async def scenario() -> None:
        async with running_discovery(tmp_path, monkeypatch, faults=faults) as (cluster, registry):
            await cluster.create(make_slice("a", [ep("10.0.0.1")]))
            await until(registry, urls("10.0.0.1"))
            await cluster.create(make_slice("b", [ep("10.0.0.2")]))
            await until(registry, urls("10.0.0.1", "10.0.0.2"))
            # The 503 list, the list before the expired watch, the list after it.
            assert cluster.requests(kmock.action.LIST) == 3

    asyncio.run(asyncio.wait_for(scenario(), 30))
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert any("API error 503" in m for m in warnings), warnings
    assert any("API error 410" in m for m in warnings), warnings
