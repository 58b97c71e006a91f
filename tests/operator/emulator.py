"""kmock's KubernetesEmulator with the API-server behaviour kopf relies on filled in.

kmock 0.8 stores objects and streams watch events, but sets no uid / resourceVersion /
creationTimestamp / generation, does not take the namespace from the URL, lets a /status
patch change the spec (and a main patch change the status), lists with a placeholder
resourceVersion, and replays every object as ADDED on each watch. This subclass does those
parts the way kube-apiserver does, and nothing else (no GC, no selectors, no validation).
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import uuid
from collections.abc import AsyncIterator
from typing import Any

import attrs
import kmock
from kmock._internal import apps, enums, rendering  # the emulator's own building blocks

RESOURCES: dict[str, dict[str, Any]] = {
    "radixserve.io/v1alpha1/inferenceservices": {
        "kind": "InferenceService",
        "subresources": {"status", "scale"},
    },
    "apps/v1/deployments": {"kind": "Deployment", "subresources": {"status", "scale"}},
    "autoscaling/v2/horizontalpodautoscalers": {
        "kind": "HorizontalPodAutoscaler",
        "subresources": {"status"},
    },
    "v1/services": {"kind": "Service", "subresources": {"status"}},
    "v1/serviceaccounts": {"kind": "ServiceAccount", "subresources": set()},
    "rbac.authorization.k8s.io/v1/roles": {"kind": "Role", "subresources": set()},
    "rbac.authorization.k8s.io/v1/rolebindings": {"kind": "RoleBinding", "subresources": set()},
    "networking.k8s.io/v1/networkpolicies": {"kind": "NetworkPolicy", "subresources": set()},
    "v1/events": {"kind": "Event", "subresources": set()},
}
# Cluster-scoped kinds kopf waits for in discovery before it starts watching.
CLUSTER_RESOURCES = {
    "v1/namespaces": {"kind": "Namespace", "subresources": set()},
    "apiextensions.k8s.io/v1/customresourcedefinitions": {
        "kind": "CustomResourceDefinition",
        "subresources": set(),
    },
}
VERBS = {"get", "list", "watch", "create", "patch", "delete"}


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _disconnected(request: rendering.Request) -> bool:
    transport = request._raw_request.transport if request._raw_request else None
    return transport is None or transport.is_closing()


def _conflict(message: str) -> kmock.KubernetesError:
    return kmock.KubernetesError(status=409, reason="Conflict", message=message)


@attrs.define(kw_only=True)
class ApiServer(kmock.KubernetesEmulator):
    _rv: int = attrs.field(default=0, init=False)
    # Every change, for watches that resume from a resourceVersion: (rv, resource, event).
    _log: list[tuple[int, Any, dict[str, Any]]] = attrs.field(factory=list, init=False)

    def declare_resources(self) -> None:
        for key, info in RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(namespaced=True, verbs=VERBS, **info)
        for key, info in CLUSTER_RESOURCES.items():
            self.resources[key] = kmock.ResourceInfo(namespaced=False, verbs=VERBS, **info)

    def _status_split(self, resource: Any) -> bool:
        info = self.resources.get(resource)
        return info is not None and "status" in info.subresources

    async def _emit(self, resource: Any, kind: str, obj: dict[str, Any]) -> None:
        event = {"type": kind, "object": copy.deepcopy(obj)}
        self._log.append((self._rv, resource, event))
        await self._buses[resource].put(event)

    def _next_rv(self) -> str:
        self._rv += 1
        return str(self._rv)

    async def _handle(self, request: rendering.Request) -> Any:
        if request.resource is not None and request.action in {
            enums.action.CREATE,
            enums.action.UPDATE,
            enums.action.DELETE,
        }:
            async with self._lock:
                await self._mutate(request)
        # Answer from the stored state (kmock's fallbacks), skipping kmock's own mutation.
        return await apps.RawHandler._handle(self, request)

    async def _mutate(self, request: rendering.Request) -> None:
        if request.action == enums.action.CREATE:
            await self._create(request)
        elif request.action == enums.action.UPDATE and request.name:
            await self._update(request)
        elif request.action == enums.action.DELETE and request.name:
            await self._delete(request)

    async def _create(self, request: rendering.Request) -> None:
        obj = copy.deepcopy(request.data)
        meta = obj.setdefault("metadata", {})
        meta.setdefault("namespace", request.namespace)
        key = (request.resource, meta["namespace"], meta["name"])
        if key in self._objects and not self._objects[key].deleted:
            raise _conflict(f"{meta['name']} already exists")
        meta.update(uid=str(uuid.uuid4()), creationTimestamp=_now(), generation=1)
        meta["resourceVersion"] = self._next_rv()
        if key in self._objects:
            self._objects[key].create(obj)
        else:
            self._objects[key] = obj
        await self._emit(request.resource, "ADDED", obj)

    def _patch_body(self, request: rendering.Request) -> Any:
        """Only status via /status, never status via the object (if it has /status)."""
        patch = request.data
        if not self._status_split(request.resource):
            return patch
        to_status = request.subresource == "status"
        if isinstance(patch, list):  # JSON patch
            return [op for op in patch if op.get("path", "").startswith("/status") == to_status]
        if to_status:
            return {"status": patch.get("status")} if "status" in patch else {}
        return {k: v for k, v in patch.items() if k != "status"}

    async def _update(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        stored = self._objects[key]
        before = copy.deepcopy(stored.raw)
        data = request.data if isinstance(request.data, dict) else {}
        wanted_rv = (data.get("metadata") or {}).get("resourceVersion")
        if wanted_rv not in (None, before["metadata"]["resourceVersion"]):
            raise _conflict("the object has been modified; please apply your changes again")
        try:
            stored.patch(self._patch_body(request))
        except Exception as exc:  # a failed JSON-patch test: the API answers 422
            raise kmock.KubernetesError(status=422, reason="Invalid", message=str(exc)) from exc
        after = stored.raw
        if after == before:
            return  # a no-op patch changes nothing, not even the resourceVersion
        meta = after.setdefault("metadata", {})
        if after.get("spec") != before.get("spec"):
            meta["generation"] = int(before["metadata"].get("generation", 1)) + 1
        meta["resourceVersion"] = self._next_rv()
        stored.history[-1] = after
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            stored.delete()
            await self._emit(request.resource, "DELETED", after)
        else:
            await self._emit(request.resource, "MODIFIED", after)

    async def _delete(self, request: rendering.Request) -> None:
        key = (request.resource, request.namespace, request.name)
        if key not in self._objects or self._objects[key].deleted:
            raise kmock.KubernetesObjectNotFoundError()
        stored = self._objects[key]
        obj = copy.deepcopy(stored.raw)
        meta = obj["metadata"]
        if meta.get("deletionTimestamp"):
            return
        meta["resourceVersion"] = self._next_rv()
        if meta.get("finalizers"):
            meta["deletionTimestamp"] = _now()
            stored.patch({"metadata": {"deletionTimestamp": meta["deletionTimestamp"]}})
            stored.history[-1] = obj
            await self._emit(request.resource, "MODIFIED", obj)
        else:
            stored.delete()
            await self._emit(request.resource, "DELETED", obj)

    async def _serve_list(self, request: rendering.Request) -> Any:
        answer = await super()._serve_list(request)
        answer["metadata"] = {"resourceVersion": str(self._rv)}
        return answer

    async def _serve_watch(self, request: rendering.Request) -> AsyncIterator[Any]:
        yield b""
        since = int(request.params.get("resourceVersion") or 0)
        assert request.resource is not None
        bus = self._buses[request.resource]
        async with self._lock:  # no change can slip between the replay and the live stream
            mark = await bus.mark()
            replay = [e for rv, res, e in self._log if rv > since and res == request.resource]
        try:
            for event in replay:
                if self._matches(request, event):
                    yield event
            while self._keep_watching(request):
                try:
                    event = await asyncio.wait_for(bus.get(since=mark), timeout=0.2)
                except asyncio.TimeoutError:
                    continue  # aiohttp does not cancel a handler whose client went away
                rv = int(event["object"]["metadata"]["resourceVersion"])
                if rv > since and self._matches(request, event):
                    yield event
        finally:
            await bus.unmark(mark)

    def _keep_watching(self, request: rendering.Request) -> bool:
        """Whether an open watch goes on (a subclass may end watches early)."""
        return not _disconnected(request)

    @staticmethod
    def _matches(request: rendering.Request, event: dict[str, Any]) -> bool:
        meta = event["object"].get("metadata", {})
        return request.namespace is None or meta.get("namespace") == request.namespace
