"""The operator's real handlers, run by kopf, against an emulated API server (kmock).

Every test starts its own emulator and an embedded operator, acts on the API over HTTP like
kubectl would, and waits for the cluster state the operator must reach. Deployment readiness
is simulated the way the Deployment controller reports it: a patch of `/status`.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import kmock
import kopf
import pytest

from radixserve.operator.config import OperatorConfig
from radixserve.operator.handlers import Runtime, register
from tests.operator.cases import SMOLLM_CPU
from tests.operator.emulator import ApiServer

pytestmark = pytest.mark.timeout(60)

NS = "llm"
ISVCS = f"/apis/radixserve.io/v1alpha1/namespaces/{NS}/inferenceservices"
DEPLOYMENTS = f"/apis/apps/v1/namespaces/{NS}/deployments"
SERVICES = f"/api/v1/namespaces/{NS}/services"
# No keep-alive: kopf, when it stops, waits 5 s for every task started after it (including
# the emulator's handlers of our idle pooled connections).
CLOSE = {"Connection": "close"}
CHILDREN = [
    f"/api/v1/namespaces/{NS}/serviceaccounts/chat-router",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles/chat-router",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings/chat-router",
    f"{SERVICES}/chat-engine",
    f"{DEPLOYMENTS}/chat-engine",
    f"{DEPLOYMENTS}/chat-router",
    f"{SERVICES}/chat",
]


class Cluster:
    """The test's kubectl: plain HTTP to the emulator."""

    def __init__(self, api: ApiServer) -> None:
        self.api = api

    async def get(self, path: str) -> dict[str, Any] | None:
        async with self.api.get(path, headers=CLOSE) as resp:
            return None if resp.status == 404 else await resp.json()

    async def send(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        headers = {"Content-Type": "application/merge-patch+json"} if method == "PATCH" else {}
        headers |= CLOSE
        async with self.api.request(method, path, json=body, headers=headers) as resp:
            assert resp.status < 400, await resp.text()
            return await resp.json()

    async def create(self, name: str, spec: dict[str, Any]) -> dict[str, Any]:
        body = {"apiVersion": "radixserve.io/v1alpha1", "kind": "InferenceService"}
        body["metadata"] = {"name": name, "namespace": NS}
        return await self.send("POST", ISVCS, {**body, "spec": copy.deepcopy(spec)})

    async def set_ready(self, deployment: str, ready: int) -> None:
        live = await self.get(f"{DEPLOYMENTS}/{deployment}")
        assert live is not None
        desired = live["spec"]["replicas"]
        status = {"replicas": desired, "readyReplicas": ready, "updatedReplicas": desired}
        status |= {"availableReplicas": ready, "observedGeneration": live["metadata"]["generation"]}
        await self.send("PATCH", f"{DEPLOYMENTS}/{deployment}/status", {"status": status})

    def requests(self, method: str, suffix: str) -> int:
        """How many such requests the API server has answered so far (kmock records them)."""
        seen = {r.id for r in self.api if r.method == method and r.url.path.endswith(suffix)}
        return len(seen)

    async def more_requests(self, method: str, suffix: str, n: int) -> None:
        """Until the API server has answered `n` more such requests from now. A resync pass
        reads every child, so this is proof that the operator made passes, where a sleep
        only guesses how long a pass takes (and proves nothing on a loaded machine)."""
        want = self.requests(method, suffix) + n

        async def seen() -> bool:
            return self.requests(method, suffix) >= want

        await eventually(seen, f"{n} more {method} ...{suffix}")


async def eventually(check: Callable[[], Awaitable[Any]], what: str, timeout: float = 15) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        result = await check()
        if result:
            return result
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        await asyncio.sleep(0.05)


def condition(isvc: dict[str, Any] | None, kind: str) -> dict[str, Any]:
    for cond in ((isvc or {}).get("status") or {}).get("conditions") or []:
        if cond["type"] == kind:
            return cond
    return {}


@contextlib.asynccontextmanager
async def operator(config: OperatorConfig | None = None) -> AsyncIterator[Cluster]:
    """An emulated API server with the operator running against it (by default with the
    default settings, but a resync every half second)."""
    async with ApiServer() as api, kmock.Server(api):
        api.declare_resources()
        url = str(api.url).rstrip("/")
        registry = kopf.OperatorRegistry()

        def login(**_: Any) -> kopf.ConnectionInfo:  # read at call time: this emulator's URL
            return kopf.ConnectionInfo(server=url)

        register(registry, config or OperatorConfig(resync_seconds=0.5), login=login)
        stop, ready = asyncio.Event(), asyncio.Event()
        task = asyncio.create_task(
            kopf.operator(
                registry=registry,
                clusterwide=True,
                standalone=True,
                stop_flag=stop,
                ready_flag=ready,
            )
        )
        await asyncio.wait_for(ready.wait(), 10)
        try:
            yield Cluster(api)
        finally:
            stop.set()
            await asyncio.wait_for(task, 20)


def run(scenario: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(scenario())


def test_create_makes_owned_children_with_the_right_args_and_status_follows() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            isvc = await k8s.create("chat", SMOLLM_CPU)
            uid = isvc["metadata"]["uid"]
            for path in CHILDREN:
                child = await eventually(lambda p=path: k8s.get(p), path)
                assert child["metadata"]["ownerReferences"][0]["uid"] == uid
                assert child["metadata"]["labels"]["app.kubernetes.io/instance"] == "chat"
            engine = await k8s.get(f"{DEPLOYMENTS}/chat-engine")
            args = engine["spec"]["template"]["spec"]["containers"][0]["args"]
            assert args[:3] == ["serve", "--model-path", "smollm2-135m"]
            assert "--kv-events-port" in args and engine["spec"]["replicas"] == 2
            router = await k8s.get(f"{DEPLOYMENTS}/chat-router")
            rargs = router["spec"]["template"]["spec"]["containers"][0]["args"]
            assert rargs[rargs.index("--k8s-service") + 1] == "chat-engine"

            first = await eventually(
                lambda: _with_status(k8s, "chat", observed=1), "status of generation 1"
            )
            assert condition(first, "Ready")["status"] == "False"
            assert first["status"]["url"] == "http://chat.llm.svc.cluster.local:80"
            assert first["status"]["selector"].count("app.kubernetes.io/component=engine") == 1

            await k8s.set_ready("chat-engine", 2)
            await k8s.set_ready("chat-router", 2)
            ready = await eventually(lambda: _ready(k8s, "chat"), "Ready=True")
            assert ready["status"]["phase"] == "Ready"
            assert (ready["status"]["replicas"], ready["status"]["readyReplicas"]) == (2, 2)
            for kind in ("EngineReady", "RouterReady"):
                assert condition(ready, kind)["status"] == "True"
            assert condition(ready, "Degraded")["status"] == "False"
            assert condition(ready, "Progressing")["status"] == "False"

    run(scenario)


async def _with_status(k8s: Cluster, name: str, observed: int) -> dict[str, Any] | None:
    isvc = await k8s.get(f"{ISVCS}/{name}")
    status = (isvc or {}).get("status") or {}
    return isvc if status.get("observedGeneration") == observed else None


async def _ready(k8s: Cluster, name: str) -> dict[str, Any] | None:
    isvc = await k8s.get(f"{ISVCS}/{name}")
    return isvc if condition(isvc, "Ready").get("status") == "True" else None


def _container(deployment: dict[str, Any] | None) -> dict[str, Any]:
    return (deployment or {})["spec"]["template"]["spec"]["containers"][0]


def test_spec_updates_patch_the_children_and_suspend_keeps_them() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            await k8s.create("chat", SMOLLM_CPU)
            await eventually(lambda: k8s.get(f"{SERVICES}/chat"), "children")
            change = {"engine": {"replicas": 3, "parallelism": {"tp": 2}}}
            change["router"] = {"policy": "round_robin"}
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": change})

            async def both_rolled() -> bool:
                # children are applied one after another: wait for the last of the two
                engine = await k8s.get(f"{DEPLOYMENTS}/chat-engine")
                args = _container(engine)["args"]
                router = await k8s.get(f"{DEPLOYMENTS}/chat-router")
                return (
                    engine["spec"]["replicas"] == 3
                    and "--tp-size" in args
                    and "round_robin" in _container(router)["args"]
                )

            await eventually(both_rolled, "engine and router Deployments patched")
            engine = await k8s.get(f"{DEPLOYMENTS}/chat-engine")
            args = _container(engine)["args"]
            assert args[args.index("--tp-size") + 1] == "2"
            router = await k8s.get(f"{DEPLOYMENTS}/chat-router")
            rargs = _container(router)["args"]
            assert rargs[rargs.index("--policy") + 1] == "round_robin"
            second = await eventually(lambda: _with_status(k8s, "chat", 2), "observedGeneration 2")
            assert condition(second, "Progressing")["status"] == "True"

            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"suspend": True}})

            async def suspended() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return isvc if (isvc.get("status") or {}).get("phase") == "Suspended" else None

            isvc = await eventually(suspended, "phase Suspended")
            assert isvc["status"]["observedGeneration"] == 3
            for name in ("chat-engine", "chat-router"):
                assert (await k8s.get(f"{DEPLOYMENTS}/{name}"))["spec"]["replicas"] == 0
            for path in CHILDREN:
                assert await k8s.get(path) is not None, f"{path} removed by suspend"

    run(scenario)


def test_children_deleted_or_edited_by_hand_are_repaired() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            await k8s.create("chat", SMOLLM_CPU)
            old = await eventually(lambda: k8s.get(f"{SERVICES}/chat-engine"), "engine Service")
            await eventually(lambda: k8s.get(f"{SERVICES}/chat"), "every child")
            await k8s.send("DELETE", f"{SERVICES}/chat-engine")
            await k8s.send("DELETE", f"{DEPLOYMENTS}/chat-router")

            async def recreated() -> bool:
                svc = await k8s.get(f"{SERVICES}/chat-engine")
                router = await k8s.get(f"{DEPLOYMENTS}/chat-router")
                new_uid = svc is not None and svc["metadata"]["uid"] != old["metadata"]["uid"]
                return new_uid and router is not None

            await eventually(recreated, "deleted children recreated")
            edit = {"spec": {"replicas": 7, "template": {"spec": {"containers": [{"name": "x"}]}}}}
            await k8s.send("PATCH", f"{DEPLOYMENTS}/chat-engine", edit)

            async def reverted() -> bool:
                engine = await k8s.get(f"{DEPLOYMENTS}/chat-engine")
                return engine["spec"]["replicas"] == 2 and _container(engine)["name"] == "engine"

            await eventually(reverted, "hand edit reverted")

    run(scenario)


def test_invalid_spec_is_degraded_once_without_retries(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = Runtime.reconcile

    async def counted(self: Runtime, **kwargs: Any) -> None:
        calls.append(kwargs["body"]["metadata"]["name"])  # a spy: behaviour unchanged
        await original(self, **kwargs)

    monkeypatch.setattr(Runtime, "reconcile", counted)
    bad = copy.deepcopy(SMOLLM_CPU)
    bad["engine"]["parallelism"] = {"tp": 4, "dp": 3, "dpAttention": True}

    async def scenario() -> None:
        async with operator() as k8s:
            await k8s.create("chat", bad)

            async def degraded() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return isvc if condition(isvc, "Degraded").get("status") == "True" else None

            isvc = await eventually(degraded, "Degraded=True")
            cond = condition(isvc, "Degraded")
            assert cond["reason"] == "InvalidSpec"
            assert "spec.engine.parallelism.dp" in cond["message"]
            assert isvc["status"]["phase"] == "Degraded"
            assert condition(isvc, "Ready")["reason"] == "InvalidSpec"
            patches_before = k8s.requests("PATCH", "/inferenceservices/chat/status")
            # Five resync passes over the invalid spec (each reads the engine Deployment for
            # the status): none may write a new status or create a child, and the handler
            # must not have been run again meanwhile.
            await k8s.more_requests("GET", "/deployments/chat-engine", 5)
            assert calls == ["chat"], "an invalid spec must not be retried"
            assert k8s.requests("PATCH", "/inferenceservices/chat/status") == patches_before
            assert k8s.requests("POST", "/deployments") == 0
            for path in CHILDREN:
                assert await k8s.get(path) is None

            fixed = {"spec": {"engine": {"parallelism": {"dp": 2}}}}
            await k8s.send("PATCH", f"{ISVCS}/chat", fixed)
            await eventually(lambda: k8s.get(f"{SERVICES}/chat"), "children after the fix")

            async def healed() -> bool:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return condition(isvc, "Degraded").get("status") == "False"

            await eventually(healed, "Degraded=False after the fix")
            assert calls == ["chat", "chat"]

    run(scenario)


def test_delete_removes_children_and_the_finalizer() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            await k8s.create("chat", SMOLLM_CPU)
            isvc = await eventually(lambda: _with_status(k8s, "chat", 1), "first status")
            assert "radixserve.io/finalizer" in isvc["metadata"]["finalizers"]
            await k8s.send("DELETE", f"{ISVCS}/chat")

            async def gone() -> bool:
                left = [p for p in [f"{ISVCS}/chat", *CHILDREN] if await k8s.get(p)]
                return not left

            await eventually(gone, "InferenceService and children deleted")

    run(scenario)


def test_a_foreign_object_in_the_way_is_reported_and_left_alone() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            theirs = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "chat"}}
            theirs["spec"] = {"ports": [{"port": 9999}]}
            await k8s.send("POST", SERVICES, theirs)
            await k8s.create("chat", SMOLLM_CPU)

            async def degraded() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return (
                    isvc if condition(isvc, "Degraded").get("reason") == "ForeignObject" else None
                )

            isvc = await eventually(degraded, "Degraded ForeignObject")
            assert "Service chat already exists" in condition(isvc, "Degraded")["message"]
            svc = await k8s.get(f"{SERVICES}/chat")
            assert svc["spec"]["ports"] == [{"port": 9999}]
            assert "ownerReferences" not in svc["metadata"]

    run(scenario)
