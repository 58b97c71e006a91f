"""The fault layer of the operator fault tests: kmock's emulator (tests/operator/emulator.py)
with a fault consulted per request (kmock's own Kubernetes error object, a closed connection, a
wait), watches that can be ended by the 410 event, and one operator's worth of kopf running
the real handlers against it."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from typing import Any

import attrs
import kmock
import kopf
from kmock._internal import rendering

from radixserve.operator.config import OperatorConfig
from radixserve.operator.handlers import register
from tests.operator.emulator import ApiServer
from tests.operator.test_operator_kmock import (
    CHILDREN,
    DEPLOYMENTS,
    ISVCS,
    NS,
    Cluster,
    condition,
    eventually,
)

Fault = Callable[[rendering.Request], Any]  # returns None (no fault) or an awaitable fault


@attrs.define(kw_only=True)
class FaultyApiServer(ApiServer):
    """The emulator, with `fault(request)` consulted before each request is served."""

    fault: Fault | None = attrs.field(default=None)
    faults_served: int = attrs.field(default=0, init=False)

    expire_watches: bool = attrs.field(default=False)
    watches_expired: int = attrs.field(default=0, init=False)

    async def _handle(self, request: rendering.Request) -> Any:
        action = self.fault(request) if self.fault is not None else None
        if action is not None:
            self.faults_served += 1
            await action
        return await super()._handle(request)

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        """While `expire_watches`, a watch ends with kube-apiserver's 410 event (too old a
        resourceVersion), which the client must answer with a fresh list: a new watch at
        once, one already open as soon as the flag is set."""
        if self.expire_watches:
            yield b""
            yield self._expired()
            return
        async for item in super()._serve_watch(request):
            yield item
        if self.expire_watches:
            yield self._expired()

    def _keep_watching(self, request: rendering.Request) -> bool:
        return not self.expire_watches and super()._keep_watching(request)

    def _expired(self) -> dict[str, Any]:
        self.watches_expired += 1
        status = {"kind": "Status", "apiVersion": "v1", "status": "Failure", "code": 410}
        status |= {"reason": "Expired", "message": "too old resource version"}
        return {"type": "ERROR", "object": status}


async def error(status: int, reason: str) -> None:
    raise kmock.KubernetesError(status=status, reason=reason, message=f"injected {status}")


async def drop(request: rendering.Request) -> None:
    raw = request._raw_request
    if raw is not None and raw.transport is not None:
        raw.transport.close()  # the client sees the connection reset, no answer
    raise kmock.KubernetesError(status=503, reason="Dropped", message="connection dropped")


async def hang_until(release: asyncio.Event) -> None:
    await release.wait()
    raise kmock.KubernetesError(status=503, reason="Dropped", message="the caller is gone")


@contextlib.asynccontextmanager
async def embedded_operator(
    api: ApiServer, error_backoffs: tuple[float, ...] | None = None
) -> AsyncIterator[asyncio.Task[Any]]:
    """One operator process's worth of kopf against `api` (stopped gracefully at the end,
    unless the test cancels the task itself: a crash). `error_backoffs`: kopf's own retries
    of a failing API call (default: kopf's, about a minute in all)."""
    url = str(api.url).rstrip("/")
    registry = kopf.OperatorRegistry()

    def login(**_: Any) -> kopf.ConnectionInfo:
        return kopf.ConnectionInfo(server=url)

    register(registry, OperatorConfig(resync_seconds=0.5), login=login)
    if error_backoffs is not None:

        @kopf.on.startup(registry=registry)
        def short_retries(settings: kopf.OperatorSettings, **_: Any) -> None:
            settings.networking.error_backoffs = error_backoffs

    stop, ready = asyncio.Event(), asyncio.Event()
    task = asyncio.create_task(
        kopf.operator(
            registry=registry, clusterwide=True, standalone=True, stop_flag=stop, ready_flag=ready
        )
    )
    await asyncio.wait_for(ready.wait(), 10)
    try:
        yield task
    finally:
        if not task.done():
            stop.set()
            await asyncio.wait_for(task, 20)


KINDS = [
    f"/api/v1/namespaces/{NS}/serviceaccounts",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/roles",
    f"/apis/rbac.authorization.k8s.io/v1/namespaces/{NS}/rolebindings",
    f"/api/v1/namespaces/{NS}/services",
    DEPLOYMENTS,
]


async def all_children(k8s: Cluster) -> dict[str, dict[str, Any]]:
    """Every object of the children's kinds in the namespace, by path (a `kubectl get`)."""
    out = {}
    for kind in KINDS:
        listing = await k8s.get(kind)
        for item in (listing or {}).get("items") or []:
            out[f"{kind}/{item['metadata']['name']}"] = item
    return out


async def converged(k8s: Cluster, uid: str) -> None:
    """Every child once, owned by `uid` alone, nothing else; then Ready once pods are."""

    async def complete() -> bool:
        return set(await all_children(k8s)) == set(CHILDREN)

    await eventually(complete, "exactly the children", timeout=30)
    for path, child in (await all_children(k8s)).items():
        owners = child["metadata"].get("ownerReferences") or []
        assert [o["uid"] for o in owners] == [uid], (path, owners)
    await k8s.set_ready("chat-engine", 2)
    await k8s.set_ready("chat-router", 2)

    async def ready() -> bool:
        isvc = await k8s.get(f"{ISVCS}/chat")
        status = (isvc or {}).get("status") or {}
        return condition(isvc, "Ready").get("status") == "True" and status.get(
            "observedGeneration"
        ) == (isvc or {}).get("metadata", {}).get("generation")

    await eventually(ready, "Ready=True at the current generation", timeout=30)


def is_request(request: rendering.Request, action: Any, path_end: str) -> bool:
    return request.action == action and request.url.path.endswith(path_end)
