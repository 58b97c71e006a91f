"""Kubernetes discovery: the pure slice → workers step, and the watch loop against kmock.

The integration tests run `watch_endpoint_slices` against kmock's Kubernetes emulator over real
HTTP (a kubeconfig points the client at it) with a real WorkerRegistry, and follow the
registry's workers through EndpointSlice creates, readiness changes, deletes and API faults.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

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
)
from radixserve.router.targets import KVEndpoint

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
    s = make_slice(
        "s1", [ep("10.0.0.1", True), ep("10.0.0.2", False), ep("10.0.0.3", None)]
    )
    assert set(slice_workers(s, CFG)) == {"http://10.0.0.1:30000", "http://10.0.0.3:30000"}


def test_kv_endpoints_from_named_ports() -> None:
    ports = [{"name": "kv-events", "port": 6000}, {"name": "http", "port": 8080}]
    w = slice_workers(make_slice("s", [ep("10.1.2.3")], ports), CFG)["http://10.1.2.3:8080"]
    # No kv-replay port: the replay socket is the next port, as the engine binds it.
    assert w.kv_override == (KVEndpoint(0, "tcp://10.1.2.3:6000", "tcp://10.1.2.3:6001"),)
    ports.append({"name": KV_REPLAY_PORT_NAME, "port": 7100})
    w = slice_workers(make_slice("s", [ep("10.1.2.3")], ports), CFG)["http://10.1.2.3:8080"]
    assert w.kv_override == (KVEndpoint(0, "tcp://10.1.2.3:6000", "tcp://10.1.2.3:7100"),)


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
