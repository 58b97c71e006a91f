"""The kopf handlers: thin glue between kopf's events and the pure builders / status code.

- create / update (of `spec`) / resume and the resync daemon make the same pass (`converge`:
  validate, apply every child, write status) and differ only in what they do when it
  fails (`reconcile`, `resync`). An invalid spec is written as Degraded and raised by the
  handler as `kopf.PermanentError`: never retried until the spec changes again.
- one daemon per InferenceService re-applies the children (repairing drift) and refreshes
  the status whenever a child changes (an `on.event` watcher on every kind in
  `kinds.child_kinds` wakes it) and at least every `resync_seconds`; it never raises, so an
  invalid spec causes no retry loop there either.
- a call to the API that fails while the children are applied is written into the status
  before the pass is retried: Degraded (reason `ApplyFailed`, the message names the step and
  the error), at the generation tried; a Deployment that cannot be read is `Unknown`.
- delete: remove the children that we own (owner references let the garbage collector do the
  same; deleting them here makes the teardown prompt and visible).
- a watch request answered with HTTP 410 Gone lists again instead of ending the operator
  (`relist.install()`, done by `register()`).

`register()` puts them into a registry, so tests run the same handlers in a fresh one.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import inspect
import logging
from collections.abc import Callable, Mapping
from typing import Any

import aiohttp
import kopf
from kubernetes_asyncio.client.exceptions import ApiException

from radixserve.operator import relist
from radixserve.operator.builders import build_children, child_refs
from radixserve.operator.config import ANNOTATION_PREFIX, FINALIZER, LABEL_OWNER, OperatorConfig
from radixserve.operator.kinds import DEPLOYMENT, INFERENCE_SERVICE, child_kinds
from radixserve.operator.kube import ApplyError, ForeignObjectError, Kube, describe, owned_by
from radixserve.operator.meta import Owner, engine_name, pool_name, router_name
from radixserve.operator.schema import ROLES, InferenceServiceSpec, SpecError
from radixserve.operator.spec import parse_spec
from radixserve.operator.status import Observation, Problem, compute_status, status_changed

LoginFn = Callable[..., Any]
TRANSIENT = (ApiException, aiohttp.ClientError, asyncio.TimeoutError)
log = logging.getLogger(__name__)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


async def default_login(**kwargs: Any) -> kopf.ConnectionInfo | None:
    """In-cluster service account, else the kubeconfig (via kubernetes_asyncio's loaders)."""
    return await kopf.login_via_async_client(**kwargs)


async def _sleep(wake: asyncio.Event, stopped: kopf.DaemonStopped, timeout: float) -> None:
    """Until woken, stopped, or `timeout` seconds passed."""
    waiters = {asyncio.ensure_future(wake.wait()), asyncio.ensure_future(stopped.wait())}
    try:
        await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()


class Runtime:
    """What one running operator's handlers share: settings, the API client, wake-ups."""

    def __init__(self, config: OperatorConfig, login: LoginFn = default_login) -> None:
        self.config = config
        self._login = login
        self._kube: Kube | None = None
        self.wakeups: dict[tuple[str, str], asyncio.Event] = {}

    @property
    def kube(self) -> Kube:
        if self._kube is None:
            raise kopf.TemporaryError("not logged in to the API yet", delay=1)
        return self._kube

    # --- activities -------------------------------------------------------------------

    async def startup(self, settings: kopf.OperatorSettings, logger: Any, **_: Any) -> None:
        """Every kopf setting in one place: our own finalizer and annotation keys."""
        settings.persistence.finalizer = FINALIZER
        settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(
            prefix=ANNOTATION_PREFIX
        )
        settings.persistence.diffbase_storage = kopf.AnnotationsDiffBaseStorage(
            prefix=ANNOTATION_PREFIX, key="last-handled-configuration"
        )
        settings.posting.level = logging.WARNING  # Kubernetes Events only for problems
        settings.watching.server_timeout = 300  # re-list now and then: no silent stale watch
        settings.watching.client_timeout = 330
        logger.info(
            "radixserve operator: engine image %s, router image %s, namespaces %s",
            self.config.engine_image,
            self.config.router_image,
            ",".join(self.config.namespaces) or "all",
        )

    async def login(self, **kwargs: Any) -> kopf.ConnectionInfo | None:
        """kopf and our client share one set of credentials (and one endpoint)."""
        result = self._login(**kwargs)
        info: kopf.ConnectionInfo | None = await result if inspect.isawaitable(result) else result
        if info is not None:
            old, self._kube = self._kube, Kube.connect(info)
            if old is not None:
                await old.close()
        return info

    async def cleanup(self, **_: Any) -> None:
        if self._kube is not None:
            await self._kube.close()
            self._kube = None

    # --- InferenceService lifecycle ---------------------------------------------------

    async def converge(self, body: kopf.Body, logger: Any) -> None:
        """One level-based pass over `body`, for the handlers and the resync alike: the spec
        onto the children, then the status.

        Every expected failure is in the status before it is raised: `SpecError` (Degraded,
        `InvalidSpec`; the children of the last valid spec are left as they are),
        `ForeignObjectError` (Degraded, `ForeignObject`) and `ApplyError` (Degraded,
        `ApplyFailed`, as far as the API lets us write it). What to do about each is the
        caller's policy: `reconcile` for kopf's handlers, `resync` for the daemon.
        """
        try:
            spec = parse_spec(body.get("spec"), body.meta["name"])
        except SpecError as exc:
            await self.write_status(body, None, Problem("InvalidSpec", str(exc)))
            raise
        try:
            outcomes = await self.apply_children(body, spec)
        except ForeignObjectError as exc:
            await self.write_status(body, spec, Problem("ForeignObject", str(exc)))
            raise
        except ApplyError as exc:
            await self.report_failure(body, spec, exc)
            raise
        changed = {name: what for name, what in outcomes.items() if what != "unchanged"}
        if changed:
            logger.info("children: %s", ", ".join(f"{n} {w}" for n, w in changed.items()))
        await self.write_status(body, spec, None)

    async def reconcile(self, body: kopf.Body, logger: Any, **_: Any) -> None:
        """create, update (of `spec`) and resume: one `converge`, with kopf's retries.

        Error policy: kopf runs this handler again after whatever it raises, until it
        succeeds or raises `PermanentError`, and logs (and posts as an Event) each failure.
        So an invalid spec is permanent: no retry can fix it, and kopf calls the handler
        again on the next change of the spec. A foreign object in a child's place waits
        `resync_seconds` between tries: only a person can remove it, and it carries none of
        our labels, so no watch event says when. An `ApplyError` (or any other failed API
        call) propagates as it is: kopf retries it after the handler's backoff.
        """
        try:
            await self.converge(body, logger)
        except SpecError as exc:
            raise kopf.PermanentError(f"invalid spec: {exc}") from exc
        except ForeignObjectError as exc:
            raise kopf.TemporaryError(str(exc), delay=self.config.resync_seconds) from exc

    async def delete(self, body: kopf.Body, logger: Any, **_: Any) -> None:
        meta = body.meta
        refs = child_refs(meta["name"], self.config)
        for api_version, kind, name in reversed(refs):
            live = await self.kube.get(api_version, kind, meta["namespace"], name)
            if live is not None and owned_by(live, meta["uid"]):
                await self.kube.delete(api_version, kind, meta["namespace"], name)
                logger.info("deleted %s %s", kind, name)

    async def resync_daemon(
        self, stopped: kopf.DaemonStopped, name: str, namespace: str | None, logger: Any, **_: Any
    ) -> None:
        if namespace is None:  # NOTE: the CRD is namespaced, so kopf always passes one
            raise kopf.PermanentError("an InferenceService without a namespace")
        key = (namespace, name)
        wake = self.wakeups.setdefault(key, asyncio.Event())
        try:
            while not stopped:
                await _sleep(wake, stopped, self.config.resync_seconds)
                wake.clear()
                if stopped:
                    break
                await self.resync(namespace, name, logger)
        finally:
            if self.wakeups.get(key) is wake:
                del self.wakeups[key]

    async def resync(self, namespace: str, name: str, logger: Any) -> None:
        """The daemon's pass: one `converge` over the live object (read afresh, so the status
        is compared with what is stored now).

        Error policy: this never raises what a pass can expect. A daemon that raises is run
        again only after kopf's backoff (the wake-ups meanwhile are lost) or, after
        `PermanentError`, never: nothing would repair this service's drift then. An invalid
        spec or a foreign object stays quiet: both are already in the status, and the
        handler logged them and posted the Event; saying so again at every wake-up would
        only flood the log. A failed API call is logged and left to the next wake-up or
        resync period, which is the retry.
        """
        try:
            live = await self.kube.get(
                INFERENCE_SERVICE.api_version, INFERENCE_SERVICE.kind, namespace, name
            )
            if live is None or live["metadata"].get("deletionTimestamp"):
                return
            await self.converge(kopf.Body(live), logger)
        except (SpecError, ForeignObjectError):
            return  # in the status already (see above)
        except (*TRANSIENT, ApplyError, kopf.TemporaryError) as exc:
            logger.warning("resync failed (will retry): %s", exc)

    async def child_event(self, namespace: str | None, labels: Mapping[str, str], **_: Any) -> None:
        """A child changed (or vanished): wake its owner's daemon."""
        wake = self.wakeups.get((namespace or "", labels.get(LABEL_OWNER, "")))
        if wake is not None:
            wake.set()

    # --- helpers ------------------------------------------------------------------------

    async def apply_children(self, body: kopf.Body, spec: InferenceServiceSpec) -> dict[str, str]:
        meta = body.meta
        owner = Owner(name=meta["name"], namespace=meta["namespace"], uid=meta["uid"])
        outcomes: dict[str, str] = {}
        wanted: set[tuple[str, str, str]] = set()
        for child in build_children(owner, spec, self.config):
            key = f"{child['kind']}/{child['metadata']['name']}"
            wanted.add((child["apiVersion"], child["kind"], child["metadata"]["name"]))
            try:
                outcomes[key] = await self.kube.apply(child, owner.uid)
            except TRANSIENT as exc:
                raise ApplyError(f"apply {key}", exc) from exc
        # Children the spec no longer asks for (the HPA, after autoscaling is removed or the
        # service suspended): ours are deleted, anyone else's are left alone.
        for api_version, kind, name in child_refs(owner.name, self.config):
            if (api_version, kind, name) in wanted:
                continue
            try:
                live = await self.kube.get(api_version, kind, owner.namespace, name)
                if live is not None and owned_by(live, owner.uid):
                    await self.kube.delete(api_version, kind, owner.namespace, name)
                    outcomes[f"{kind}/{name}"] = "deleted"
            except TRANSIENT as exc:
                raise ApplyError(f"delete {kind}/{name}", exc) from exc
        return outcomes

    async def report_failure(
        self, body: kopf.Body, spec: InferenceServiceSpec, exc: ApplyError
    ) -> None:
        """Put a failed apply into the status (Degraded, `ApplyFailed`), as far as the API lets
        us: the caller raises `exc` afterwards either way."""
        try:
            await self.write_status(body, spec, Problem("ApplyFailed", f"{exc}; will retry"))
        except TRANSIENT as failed:
            log.warning("could not write the status of %s: %s", body.meta["name"], describe(failed))

    async def _read_deployment(
        self, namespace: str, name: str, owner_uid: str
    ) -> tuple[Mapping[str, Any] | None, str | None]:
        """(our Deployment or None, why it could not be read or None)."""
        try:
            live = await self.kube.get(DEPLOYMENT.api_version, DEPLOYMENT.kind, namespace, name)
        except TRANSIENT as exc:
            return None, describe(exc)
        return (live if live is not None and owned_by(live, owner_uid) else None), None

    async def write_status(
        self, body: kopf.Body, spec: InferenceServiceSpec | None, problem: Problem | None
    ) -> None:
        meta = body.meta
        name, namespace = meta["name"], meta["namespace"]
        raw_spec = body.get("spec") or {}
        suspended = spec.suspend if spec is not None else bool(raw_spec.get("suspend"))
        engine, engine_unread = await self._read_deployment(
            namespace, engine_name(name), meta["uid"]
        )
        router, router_unread = await self._read_deployment(
            namespace, router_name(name), meta["uid"]
        )
        pd = spec is not None and spec.pd is not None
        pools = {}
        if pd or (spec is None and raw_spec.get("prefill") is not None):
            for role in ROLES:
                pools[role] = await self._read_deployment(
                    namespace, pool_name(name, role), meta["uid"]
                )
        observation = Observation(
            name=name,
            namespace=namespace,
            generation=int(meta.get("generation") or 1),
            suspended=suspended,
            engine=engine,
            router=router,
            problem=problem,
            previous=body.get("status"),
            engine_unread=engine_unread,
            router_unread=router_unread,
            pools=pools or None,
        )
        status = compute_status(observation, _now())
        if status_changed(body.get("status"), status):
            with contextlib.suppress(ApiException):  # deleted meanwhile: nothing to report
                await self.kube.patch_status(namespace, name, status)


def register(
    registry: kopf.OperatorRegistry, config: OperatorConfig, login: LoginFn = default_login
) -> Runtime:
    """Put every handler of the operator into `registry`; returns their shared state."""
    relist.install()
    rt = Runtime(config, login)
    isvc = INFERENCE_SERVICE.kopf_resource
    kopf.on.startup(registry=registry)(rt.startup)
    kopf.on.login(registry=registry)(rt.login)
    kopf.on.cleanup(registry=registry)(rt.cleanup)
    kopf.on.resume(*isvc, registry=registry, id="resume", backoff=5)(rt.reconcile)
    kopf.on.create(*isvc, registry=registry, id="create", backoff=5)(rt.reconcile)
    kopf.on.update(*isvc, registry=registry, id="update", backoff=5, field="spec")(rt.reconcile)
    kopf.on.delete(*isvc, registry=registry, id="delete", backoff=5)(rt.delete)
    kopf.daemon(*isvc, registry=registry, id="resync", cancellation_timeout=5)(rt.resync_daemon)
    # Every kind the operator builds: a hand edit of any child wakes its owner's daemon.
    for kind in child_kinds(config):
        owned = {LABEL_OWNER: kopf.PRESENT}
        kopf.on.event(*kind.kopf_resource, registry=registry, labels=owned)(rt.child_event)
    return rt
