"""Operator faults against the emulated API server (kmock, as tests/operator uses it), with the
operator's real handlers run by kopf:

- the operator killed in the middle of a reconcile (its task cancelled while one of its
  creates hangs on the API server) and a new one started: it converges, and every child
  exists once, owned by the InferenceService, with nothing else left behind;
- the API server answering calls on the children with 500, 409, a dropped connection or a
  slow answer, in turn, and ending every watch with a 410 (Expired) event: the operator
  retries without a hot loop (a pass stops at its first failed call; kopf puts the failed
  handler's retry off by its backoff), the status never claims more than the children
  show, and it converges once the faults stop;
- every watch request answered with an HTTP 410 Gone (not the event inside a stream): the
  operator lists again and goes on reconciling instead of ending.

The fault layer (`kmock_faults.py`) is a subclass of the test emulator that decides, per
request, to answer with kmock's own Kubernetes error object, to close the connection, or to
wait first.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import json
import re
from typing import Any

import kmock
import pytest
from kmock._internal import enums, rendering

from tests.operator.cases import SMOLLM_CPU
from tests.operator.test_operator_kmock import CHILDREN, DEPLOYMENTS, ISVCS, Cluster, eventually
from tests.reliability.kmock_faults import (
    KINDS,
    FaultyApiServer,
    all_children,
    converged,
    drop,
    embedded_operator,
    error,
    hang_until,
    is_request,
)

pytestmark = pytest.mark.timeout(90)


def test_operator_killed_mid_reconcile_and_restarted_converges_without_duplicates() -> None:
    release = asyncio.Event()
    hung = asyncio.Event()

    def fault(request: rendering.Request) -> Any:
        # The engine Deployment's create hangs: the operator is mid-reconcile, some children
        # made, some not, when it dies.
        data = request.data if isinstance(request.data, dict) else {}
        engine = (data.get("metadata") or {}).get("name") == "chat-engine"
        if (
            is_request(request, enums.action.CREATE, "/deployments")
            and engine
            and not release.is_set()
        ):
            hung.set()
            return hang_until(release)
        return None

    async def scenario() -> None:
        async with FaultyApiServer(fault=fault) as api, kmock.Server(api):
            api.declare_resources()
            k8s = Cluster(api)
            async with embedded_operator(api) as first:
                isvc = await k8s.create("chat", SMOLLM_CPU)
                await asyncio.wait_for(hung.wait(), 15)
                made = set(await all_children(k8s))
                assert made and made < set(CHILDREN), made  # really in the middle
                first.cancel()  # a crash: no graceful stop, no cleanup handlers
                with contextlib.suppress(asyncio.CancelledError):
                    await first
            release.set()  # the hung create fails now (its caller is gone)
            async with embedded_operator(api):
                await converged(k8s, isvc["metadata"]["uid"])

    asyncio.run(scenario())


MIN_FAILED_PASSES = 4  # faults last at least this many failed reconcile passes
MAX_FAILED_PASSES = 20  # by then the status shows the new generation, kopf the retry
# A failing pass stops at its first failed call (a slow answer or two may come first), then
# reads both Deployments for the status (faulted too). A pass whose only faults are those
# reads succeeds and logs nothing, hence the room above 4. A retry loop inside a pass (a
# failed call tried again at once) goes far beyond.
CALLS_PER_FAILED_PASS = 8
HANDLER_BACKOFF_S = 5  # `backoff=` of the handlers' registration
FAILED_PASS = re.compile(r"^(resync failed \(will retry\)|Handler '[^']+' failed)")
PLURALS = {
    "ServiceAccount": "serviceaccounts",
    "Role": "roles",
    "RoleBinding": "rolebindings",
    "Service": "services",
    "Deployment": "deployments",
}
STEP = re.compile(r"^(apply|delete) (\w+)/([\w-]+) failed: (.+); will retry$")
CHILD_NAMES = {(path.split("/")[-2], path.split("/")[-1]) for path in CHILDREN}


class Passes:
    """Reconcile passes that failed from now on, by the operator's own log: the resync daemon
    warns once per failed pass, kopf logs each failed handler run."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self.caplog = caplog
        self.start = len(caplog.records)

    def failed(self) -> int:
        records = self.caplog.records[self.start :]
        return sum(1 for r in records if FAILED_PASS.match(r.getMessage()))


def _handler_retry(isvc: dict[str, Any]) -> dict[str, Any] | None:
    """kopf's progress record of the update handler once it has put a retry off, else None."""
    raw = (isvc["metadata"].get("annotations") or {}).get("radixserve.io/update.spec")
    record: dict[str, Any] | None = json.loads(raw) if raw else None
    return record if record and record.get("retries", 0) >= 1 and record.get("delayed") else None


def _iso(stamp: str) -> datetime.datetime:
    return datetime.datetime.fromisoformat(stamp)


def _target(request: rendering.Request) -> tuple[str, str]:
    """(plural, name) of the child a request is about."""
    data = request.data if isinstance(request.data, dict) else {}
    name = request.name or (data.get("metadata") or {}).get("name") or ""
    plural = request.resource.plural if request.resource is not None else ""
    return plural or "", name


COUNTS = ("replicas", "readyReplicas", "routerReplicas", "routerReadyReplicas")


def _dishonest(isvc: dict[str, Any], faulted: set[tuple[str, str]], counts: list[int]) -> list[str]:
    """What the status claims beyond what is true while calls on the children fail: replica
    counts other than the Deployments report (`counts`, which do not change meanwhile), any
    readiness, conditions of another generation; and once it describes the current
    generation, anything but Degraded naming a step that really failed."""
    status, generation = isvc.get("status") or {}, isvc["metadata"]["generation"]
    wrong = []
    shown = status.get("observedGeneration", 0)
    if shown > generation:
        wrong.append(f"observedGeneration {shown} > {generation}")
    conds = {c["type"]: c for c in status.get("conditions") or []}
    for cond in conds.values():
        if cond.get("observedGeneration") != shown:
            wrong.append(f"{cond['type']} describes another generation: {cond}")
    for kind in ("Ready", "EngineReady", "RouterReady"):
        if conds.get(kind, {}).get("status") == "True":
            wrong.append(f"{kind}=True with 1 of 2 replicas ready")
    if [status.get(key) for key in COUNTS] != counts:
        wrong.append(f"counts {[status.get(key) for key in COUNTS]}, the Deployments: {counts}")
    if shown < generation:
        return wrong  # written before the edit: true when written
    degraded = conds.get("Degraded", {})
    step = STEP.match(degraded.get("message", ""))
    if degraded.get("status") != "True" or degraded.get("reason") != "ApplyFailed" or not step:
        wrong.append(f"Degraded does not name the failing step: {degraded}")
    elif (PLURALS.get(step[2], "?"), step[3]) not in faulted & CHILD_NAMES:
        wrong.append(f"the step named never failed: {step[0]} (failed: {sorted(faulted)})")
    if status.get("phase") != "Degraded":
        wrong.append(f"phase {status.get('phase')}")
    return wrong


async def _converged_fields(k8s: Cluster, generation: int) -> None:
    """After the faults: every condition true to the children at `generation`, the counts
    those of the Deployments."""
    final = await k8s.get(f"{ISVCS}/chat")
    assert final is not None and final["metadata"]["generation"] == generation
    status = final["status"]
    conds = {c["type"]: c for c in status["conditions"]}
    assert {k: c["status"] for k, c in conds.items()} == {
        "Ready": "True",
        "EngineReady": "True",
        "RouterReady": "True",
        "Progressing": "False",
        "Degraded": "False",
    }, conds
    assert conds["Degraded"]["reason"] == "AsExpected", conds["Degraded"]
    assert all(c["observedGeneration"] == generation for c in conds.values()), conds
    assert status["phase"] == "Ready"
    counts = [status[k] for k in ("replicas", "readyReplicas")]
    counts += [status[k] for k in ("routerReplicas", "routerReadyReplicas")]
    assert counts == [2, 2, 2, 2], status


def test_api_faults_are_retried_with_backoff_status_stays_honest_and_it_converges(
    caplog: pytest.LogCaptureFixture,
) -> None:
    faults_on = asyncio.Event()
    kinds = [
        lambda r: error(500, "InternalError"),
        lambda r: error(409, "Conflict"),
        lambda r: drop(r),
        lambda r: asyncio.sleep(1.5),  # a slow answer
    ]
    seen: list[int] = []
    faulted: set[tuple[str, str]] = set()  # (plural, name) of the children whose calls failed

    def fault(request: rendering.Request) -> Any:
        if (
            not faults_on.is_set()
            or request.url.path.startswith(ISVCS)
            and (request.action == enums.action.CREATE)
        ):
            return None
        if request.resource is None or not request.url.path.startswith(
            ("/api/v1/namespaces", "/apis/apps", "/apis/rbac")
        ):
            return None
        if request.action not in (enums.action.CREATE, enums.action.UPDATE, enums.action.FETCH):
            return None
        seen.append(len(seen))
        action = kinds[len(seen) % len(kinds)]
        if action is not kinds[3]:
            faulted.add(_target(request))
        return action(request)

    async def scenario() -> None:
        async with FaultyApiServer(fault=fault) as api, kmock.Server(api):
            api.declare_resources()
            k8s = Cluster(api)
            async with embedded_operator(api):
                isvc = await k8s.create("chat", SMOLLM_CPU)

                async def made() -> bool:
                    return set(await all_children(k8s)) == set(CHILDREN)

                await eventually(made, "the children of generation 1", timeout=30)
                await k8s.set_ready("chat-engine", 1)  # 1 of 2 pods ready, each
                await k8s.set_ready("chat-router", 1)
                truth = [2, 1, 2, 1]

                async def seen_half_ready() -> bool:
                    now = await k8s.get(f"{ISVCS}/chat")
                    return [((now or {}).get("status") or {}).get(k) for k in COUNTS] == truth

                await eventually(seen_half_ready, "the status of 1 of 2 ready", timeout=30)
                faults_on.set()
                api.expire_watches = True
                # The spec changes while every call to a child fails one way or another: the
                # status must say what failed at generation 2, and nothing more.
                scheduler = {"scheduler": {"maxRunningRequests": 32}}
                await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"engine": scheduler}})
                passes = Passes(caplog)
                reported: dict[int, int] = {}  # generation shown -> snapshots
                retry: dict[str, Any] | None = None  # kopf's record of the handler's retry
                # For MIN_FAILED_PASSES failed passes, until the status has shown the new
                # generation twice and kopf has put a retry of the failed update handler off:
                # what the status says meanwhile must be true. Counted in passes, not seconds,
                # so a slow machine gets as many faults as a fast one.
                while passes.failed() < MIN_FAILED_PASSES or reported.get(2, 0) < 2 or not retry:
                    failed = passes.failed()
                    assert failed < MAX_FAILED_PASSES, f"status by generation {reported}, {retry=}"
                    now = await k8s.get(f"{ISVCS}/chat")
                    assert now is not None
                    assert not _dishonest(now, faulted, truth), _dishonest(now, faulted, truth)
                    shown = now["status"]["observedGeneration"]
                    reported[shown] = reported.get(shown, 0) + 1
                    retry = _handler_retry(now) or retry
                    await asyncio.sleep(0.2)
                tried, failed = len(seen), passes.failed()
                assert tried >= 3, "the operator gave up instead of retrying"
                # No hot loop: a pass ends at its first failed call, and kopf retries the
                # failed handler only after its backoff (kopf's own record of when it may).
                assert tried <= CALLS_PER_FAILED_PASS * (failed + 2), (tried, failed)
                assert retry is not None  # the loop waited for it
                started, delayed = (_iso(retry[k]) for k in ("started", "delayed"))
                assert (delayed - started).total_seconds() >= HANDLER_BACKOFF_S, retry
                faults_on.clear()
                api.expire_watches = False

                async def applied() -> bool:  # the edit reached the engine Deployment
                    engine = await k8s.get(f"{DEPLOYMENTS}/chat-engine")
                    args = engine["spec"]["template"]["spec"]["containers"][0]["args"]
                    return args[args.index("--max-running-requests") + 1] == "32"

                await eventually(applied, "generation 2 applied", timeout=30)
                await converged(k8s, isvc["metadata"]["uid"])
                await _converged_fields(k8s, generation=2)
            print(
                f"operator faults: {tried} calls failed in {failed} failed passes, "
                f"{api.watches_expired} watches expired, status snapshots by generation "
                f"{reported}, then converged"
            )

    asyncio.run(scenario())


GONE_WINDOW_S = 2.0
OUTAGE_S = 3.0  # much longer than kopf's retries in the test (0.05 + 0.1 s)


def test_watch_requests_answered_410_gone_list_again_and_it_keeps_reconciling() -> None:
    gone = asyncio.Event()
    answered = {"watch 410": 0, "list": 0}

    def fault(request: rendering.Request) -> Any:
        if not gone.is_set():
            return None
        if request.action == enums.action.LIST:
            answered["list"] += 1
        if request.action == enums.action.WATCH:
            answered["watch 410"] += 1
            return error(410, "Expired")  # the answer to the request, before any stream
        return None

    async def scenario() -> None:
        async with FaultyApiServer(fault=fault) as api, kmock.Server(api):
            api.declare_resources()
            k8s = Cluster(api)
            async with embedded_operator(api) as running:
                gone.set()
                # Created while no watch can start: only a fresh list shows it to kopf.
                isvc = await k8s.create("chat", SMOLLM_CPU)

                async def reconciled() -> bool:
                    assert not running.done(), "the operator ended on a 410 answer to a watch"
                    return set(await all_children(k8s)) == set(CHILDREN)

                await eventually(reconciled, "children made while every watch is 410", 30)
                await asyncio.sleep(GONE_WINDOW_S)
                assert not running.done(), "the operator ended on a 410 answer to a watch"
                # every watched kind was listed again after its watch was refused, many times
                assert answered["watch 410"] >= 2 * len(KINDS), answered
                assert answered["list"] >= answered["watch 410"] // 2, answered
                gone.clear()
                await converged(k8s, isvc["metadata"]["uid"])
                assert not running.done()
            print(f"watch 410 Gone: {answered}, then converged")

    asyncio.run(scenario())


def test_watches_failing_past_kopfs_retries_are_retried_and_it_keeps_reconciling() -> None:
    """Every watch request answered 503 for longer than kopf's own retries: kopf gives up on
    the watch, and the operator must back off, list again and go on (before: it ended)."""
    outage = asyncio.Event()
    answered = {"watch 503": 0}

    def fault(request: rendering.Request) -> Any:
        if outage.is_set() and request.action == enums.action.WATCH:
            answered["watch 503"] += 1
            return error(503, "ServiceUnavailable")
        return None

    async def scenario() -> None:
        async with FaultyApiServer(fault=fault) as api, kmock.Server(api):
            api.declare_resources()
            k8s = Cluster(api)
            async with embedded_operator(api, error_backoffs=(0.05, 0.1)) as running:
                outage.set()
                await asyncio.sleep(OUTAGE_S / 2)  # every watcher has given up by now
                isvc = await k8s.create("chat", SMOLLM_CPU)

                async def reconciled() -> bool:
                    assert not running.done(), "the operator ended on an API outage"
                    return set(await all_children(k8s)) == set(CHILDREN)

                await eventually(reconciled, "children made while every watch is 503", 30)
                await asyncio.sleep(OUTAGE_S / 2)
                assert not running.done(), "the operator ended on an API outage"
                assert answered["watch 503"] >= 3 * len(KINDS), answered
                outage.clear()
                await converged(k8s, isvc["metadata"]["uid"])
                assert not running.done()
            print(f"watch outage: {answered}, then converged")

    asyncio.run(scenario())
