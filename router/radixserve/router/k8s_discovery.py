"""Kubernetes discovery: follow a Service's EndpointSlices and keep the worker registry in step.

The router lists `discovery.k8s.io/v1` EndpointSlices labelled `kubernetes.io/service-name=<svc>`,
then watches them from the list's resourceVersion. Each event updates a per-slice map; the desired
worker set is recomputed from the whole map (an address may move between slices) and diffed
against the registry's `source="k8s"` workers. A 410 Gone or any other error leads to a fresh list
after a backoff: discovery never takes the router down.

The slice → workers step is a pure function over the API's JSON (camelCase) so it can be tested
without a cluster. An endpoint counts as ready unless `conditions.ready` is false: kube-proxy
treats a missing condition the same way.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from kubernetes_asyncio import client, watch
from kubernetes_asyncio import config as kube_config
from kubernetes_asyncio.client.exceptions import ApiException
from kubernetes_asyncio.config.config_exception import ConfigException

from radixserve.router.addresses import KVEndpoint
from radixserve.router.config import RouterConfig

if TYPE_CHECKING:
    from aiohttp import ClientResponse

    from radixserve.router.workers import WorkerRegistry

logger = logging.getLogger(__name__)

SOURCE = "k8s"
SERVICE_LABEL = "kubernetes.io/service-name"
KV_REPLAY_PORT_NAME = "kv-replay"
NAMESPACE_FILE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
WATCH_TIMEOUT_S = 300  # the server ends each watch after this; we resume from the last version
CONNECT_TIMEOUT_S = 10
LIST_TIMEOUT_S = 60
INITIAL_BACKOFF_S = 0.5
MAX_BACKOFF_S = 30.0

Slice = Mapping[str, Any]


@dataclass(frozen=True)
class DesiredWorker:
    """One worker as its EndpointSlice describes it."""

    url: str
    kv_override: tuple[KVEndpoint, ...] | None = None


# ---- pure: slices → desired workers --------------------------------------------------------


def endpoint_ready(endpoint: Mapping[str, Any]) -> bool:
    """Ready unless `conditions.ready` is explicitly false (a missing value means ready)."""
    return (endpoint.get("conditions") or {}).get("ready") is not False


def _named_port(ports: Iterable[Mapping[str, Any]], name: str) -> int | None:
    for port in ports:
        if (port.get("name") or "") == name and port.get("port"):
            return int(port["port"])
    return None


def _http_port(ports: list[Mapping[str, Any]], name: str) -> int | None:
    found = _named_port(ports, name)
    # A Service with a single port may leave it unnamed; its one port is then the HTTP port.
    if found is None and len(ports) == 1 and not ports[0].get("name") and ports[0].get("port"):
        return int(ports[0]["port"])
    return found


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def slice_workers(slice_obj: Slice, cfg: RouterConfig) -> dict[str, DesiredWorker]:
    """The ready endpoints of one EndpointSlice, as workers keyed by URL."""
    ports = list(slice_obj.get("ports") or ())
    http = _http_port(ports, cfg.k8s_http_port_name)
    if http is None:
        name = (slice_obj.get("metadata") or {}).get("name")
        logger.warning("EndpointSlice %s has no port named %r", name, cfg.k8s_http_port_name)
        return {}
    rank_ports = _kv_rank_ports(ports, cfg.k8s_kv_events_port_name)
    out: dict[str, DesiredWorker] = {}
    for endpoint in slice_obj.get("endpoints") or ():
        if not endpoint_ready(endpoint):
            continue
        for address in endpoint.get("addresses") or ():
            host = _host(address)
            kv_override = None
            if rank_ports:
                kv_override = tuple(
                    KVEndpoint(rank, f"tcp://{host}:{kv}", f"tcp://{host}:{replay}")
                    for rank, kv, replay in rank_ports
                )
            url = f"http://{host}:{http}"
            out[url] = DesiredWorker(url, kv_override)
    return out


def _kv_rank_ports(ports: list[Any], name: str) -> list[tuple[int, int, int]]:
    """(dp_rank, events port, replay port) of every DP rank the slice names: rank 0 as
    `kv-events` / `kv-replay`, rank r > 0 as `kv-events-<r>` / `kv-replay-<r>` (the operator's
    names); a missing replay port is the events port + 1 (the engine's rule)."""
    out: list[tuple[int, int, int]] = []
    rank = 0
    while True:
        suffix = f"-{rank}" if rank else ""
        kv = _named_port(ports, name + suffix)
        if kv is None:
            return out
        replay = _named_port(ports, KV_REPLAY_PORT_NAME + suffix) or kv + 1
        out.append((rank, kv, replay))
        rank += 1


def desired_workers(slices: Iterable[Slice], cfg: RouterConfig) -> dict[str, DesiredWorker]:
    """The union over slices: during a rollout one address may sit in two slices."""
    out: dict[str, DesiredWorker] = {}
    for slice_obj in slices:
        out.update(slice_workers(slice_obj, cfg))
    return out


def belongs_to(slice_obj: Slice, service: str) -> bool:
    labels = (slice_obj.get("metadata") or {}).get("labels") or {}
    return bool(labels.get(SERVICE_LABEL) == service)


# ---- registry diff ------------------------------------------------------------------------


async def sync_registry(registry: WorkerRegistry, desired: Mapping[str, DesiredWorker]) -> None:
    """Add the new workers, remove the gone ones (and those whose KV ports changed)."""
    for url, worker in list(registry.workers.items()):
        if worker.source != SOURCE:
            continue
        want = desired.get(url)
        if want is None or want.kv_override != worker.kv_override:
            with contextlib.suppress(KeyError):  # already removed meanwhile (admin API)
                await registry.remove(url)
    for url, want in desired.items():
        if url in registry.workers:
            continue
        try:
            registry.add(url, source=SOURCE, kv_override=want.kv_override)
        except ValueError as exc:
            logger.warning("k8s discovery cannot add %s: %s", url, exc)


# ---- the watch loop -----------------------------------------------------------------------


def resolve_namespace(explicit: str | None, namespace_file: str = NAMESPACE_FILE) -> str:
    if explicit:
        return explicit
    try:
        with open(namespace_file, encoding="utf-8") as f:
            return f.read().strip() or "default"
    except OSError:
        return "default"


async def load_client_config() -> client.Configuration:
    """In-cluster service account first, else the kubeconfig named by $KUBECONFIG now."""
    cfg = client.Configuration()
    try:
        kube_config.load_incluster_config(client_configuration=cfg)  # type: ignore[no-untyped-call]  # kubernetes_asyncio leaves this loader unannotated
    except ConfigException:
        # The library reads $KUBECONFIG at import time; read it at call time instead.
        path = os.environ.get("KUBECONFIG") or os.path.expanduser("~/.kube/config")
        await kube_config.load_kube_config(path, client_configuration=cfg, persist_config=False)
    return cfg


class _SliceWatcher:
    def __init__(
        self, cfg: RouterConfig, registry: WorkerRegistry, namespace: str, service: str
    ) -> None:
        self.cfg = cfg
        self.registry = registry
        self.namespace = namespace
        self.service = service
        self.slices: dict[str, Slice] = {}
        self.backoff = INITIAL_BACKOFF_S

    async def run(self) -> None:
        while True:
            try:
                async with client.ApiClient(await load_client_config()) as api:
                    await self._list_and_watch(client.DiscoveryV1Api(api))
            except ApiException as exc:
                logger.warning("k8s discovery: API error %s %s; re-listing", exc.status, exc.reason)
            except Exception as exc:  # any failure means: list again later
                logger.warning("k8s discovery failed: %r; re-listing", exc)
            await asyncio.sleep(self.backoff)
            self.backoff = min(self.backoff * 2, MAX_BACKOFF_S)

    async def _list_and_watch(self, api: client.DiscoveryV1Api) -> None:
        selector = f"{SERVICE_LABEL}={self.service}"
        # _preload_content=False returns the raw aiohttp response (not what the generated
        # annotation says): the body is read as plain dicts, like the watch below.
        resp = cast(
            "ClientResponse",
            await api.list_namespaced_endpoint_slice(
                self.namespace,
                label_selector=selector,
                _preload_content=False,
                _request_timeout=(CONNECT_TIMEOUT_S, LIST_TIMEOUT_S),
            ),
        )
        async with resp:
            if resp.status != 200:
                raise ApiException(status=resp.status, reason=await resp.text())
            body = await resp.json()
        # Client-side filter too: not every API server (or emulator) honours the selector.
        items = [s for s in body.get("items") or () if belongs_to(s, self.service)]
        self.slices = {s["metadata"]["name"]: s for s in items}
        await self._sync()
        self.backoff = INITIAL_BACKOFF_S
        version = (body.get("metadata") or {}).get("resourceVersion")
        while True:  # each pass ends at the server's timeout; resume where it stopped
            stream = watch.Watch(return_type="object")  # plain dicts: we read raw_object only
            async with stream:
                kwargs: dict[str, Any] = {"resource_version": version} if version else {}
                async for event in stream.stream(
                    api.list_namespaced_endpoint_slice,
                    self.namespace,
                    label_selector=selector,
                    timeout_seconds=WATCH_TIMEOUT_S,
                    allow_watch_bookmarks=True,
                    # A silent connection (a dead node, a lost NAT entry) must not hang here.
                    _request_timeout=(CONNECT_TIMEOUT_S, WATCH_TIMEOUT_S + 30),
                    **kwargs,
                ):
                    await self._apply(event["type"], event["raw_object"])
                version = stream.resource_version or version

    async def _apply(self, kind: str, obj: Slice) -> None:
        name = (obj.get("metadata") or {}).get("name")
        if kind == "BOOKMARK" or not name:
            return
        if kind == "DELETED" or not belongs_to(obj, self.service):
            if self.slices.pop(name, None) is None:
                return
        else:
            self.slices[name] = obj
        await self._sync()

    async def _sync(self) -> None:
        await sync_registry(self.registry, desired_workers(self.slices.values(), self.cfg))


async def watch_endpoint_slices(
    config: RouterConfig, registry: WorkerRegistry, service: str | None = None
) -> None:
    """Run forever: keep the registry's k8s workers equal to the ready endpoints of `service`
    (default --k8s-service; in PD mode each pool's Service)."""
    service = service or config.k8s_service
    if not service:
        raise ValueError("k8s_service: discovery needs a Service name")
    namespace = resolve_namespace(config.k8s_namespace)
    logger.info("k8s discovery: service=%s namespace=%s", service, namespace)
    await _SliceWatcher(config, registry, namespace, service).run()
