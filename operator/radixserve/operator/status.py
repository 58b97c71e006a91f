"""InferenceService status from what the children report: a pure function of the two
Deployments (as read from the API), the spec's fate, and the previous status.

Conditions follow Kubernetes conventions: each has a CamelCase reason, a human message, the
generation it describes, and a lastTransitionTime that moves only when its status flips. A
Deployment that could not be read (the API failed) makes its condition `Unknown`, and its
replica counts stay what was last read: the status never guesses.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from radixserve.operator.meta import ENGINE, selector_string, service_url

CONDITIONS = ("Ready", "EngineReady", "RouterReady", "Progressing", "Degraded")


@dataclass(frozen=True)
class Problem:
    """Why the spec cannot be (fully) applied: shown as Degraded."""

    reason: str
    message: str


# (status, reason, message) of one condition; status None is "Unknown".
Verdict = tuple[bool | None, str, str]


@dataclass(frozen=True)
class Rollout:
    """One Deployment's progress, from its spec and status."""

    name: str
    desired: int
    replicas: int
    ready: int
    updated: int
    current: bool  # the Deployment controller has seen its latest spec
    stalled: str | None  # ProgressDeadlineExceeded message

    @property
    def settled(self) -> bool:
        return (
            self.current
            and self.updated >= self.desired
            and self.replicas == self.desired
            and self.ready >= self.desired
        )

    def summary(self, component: str) -> str:
        return f"{self.ready}/{self.desired} {component} replicas ready"


def rollout(deployment: Mapping[str, Any] | None) -> Rollout | None:
    if deployment is None:
        return None
    spec = deployment.get("spec") or {}
    status = deployment.get("status") or {}
    meta = deployment.get("metadata") or {}
    stalled = None
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Progressing" and cond.get("reason") == "ProgressDeadlineExceeded":
            stalled = cond.get("message") or "progress deadline exceeded"
    return Rollout(
        name=meta.get("name", ""),
        desired=int(spec.get("replicas", 1)),
        replicas=int(status.get("replicas", 0)),
        ready=int(status.get("readyReplicas", 0)),
        updated=int(status.get("updatedReplicas", 0)),
        current=int(status.get("observedGeneration", 0)) >= int(meta.get("generation", 1)),
        stalled=stalled,
    )


def _component(component: str, r: Rollout | None, suspended: bool, unread: str | None) -> Verdict:
    """(ready, reason, message) of EngineReady / RouterReady."""
    if unread is not None:
        return None, "ReadFailed", f"the {component} Deployment could not be read: {unread}"
    if r is None:
        return False, "NotCreated", f"the {component} Deployment does not exist yet"
    if r.desired == 0:
        reason = "Suspended" if suspended else "ScaledToZero"
        return False, reason, f"{r.name} is scaled to zero"
    if r.ready >= r.desired:
        return True, "ReplicasReady", r.summary(component)
    return False, "ReplicasNotReady", r.summary(component)


def _progressing(
    engine: Rollout | None,
    router: Rollout | None,
    problem: Problem | None,
    suspended: bool,
    unread: Sequence[str],
) -> Verdict:
    if problem is not None and problem.reason == "InvalidSpec":
        return False, "InvalidSpec", "the spec is not applied"
    if unread:
        return None, "ReadFailed", "; ".join(unread)
    pending = [r for r in (engine, router) if r is None or not r.settled]
    if not pending:
        return False, "Suspended" if suspended else "Complete", "every Deployment is settled"
    parts = [
        f"{r.name}: {r.updated}/{r.desired} updated, {r.ready} ready" if r else "creating"
        for r in pending
    ]
    return True, "RollingOut", "; ".join(parts)


def _degraded(engine: Rollout | None, router: Rollout | None, problem: Problem | None) -> Verdict:
    if problem is not None:
        return True, problem.reason, problem.message
    for r in (engine, router):
        if r is not None and r.stalled:
            return True, "ProgressDeadlineExceeded", f"{r.name}: {r.stalled}"
    return False, "AsExpected", "no problem found"


def _ready(engine: Verdict, router: Verdict, degraded: Verdict, suspended: bool) -> Verdict:
    if degraded[0]:
        return False, degraded[1], degraded[2]
    if suspended:
        return False, "Suspended", "spec.suspend is true"
    if engine[0] is False:
        return False, "EngineNotReady", engine[2]
    if router[0] is False:
        return False, "RouterNotReady", router[2]
    if engine[0] is None or router[0] is None:
        return None, "ReadFailed", engine[2] if engine[0] is None else router[2]
    return True, "Ready", f"{engine[2]}; {router[2]}"


def _phase(conds: Mapping[str, Verdict], suspended: bool) -> str:
    if conds["Degraded"][0]:
        return "Degraded"
    if suspended:
        return "Suspended"
    if conds["Ready"][0]:
        return "Ready"
    return "Progressing" if conds["Progressing"][0] else "Pending"


CONDITION_STATUS = {True: "True", False: "False", None: "Unknown"}


def _conditions(
    values: Mapping[str, Verdict],
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for kind in CONDITIONS:
        ok, reason, message = values[kind]
        status = CONDITION_STATUS[ok]
        old = before.get(kind) or {}
        since = old.get("lastTransitionTime") if old.get("status") == status else None
        out.append(
            {
                "type": kind,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since or now,
                "observedGeneration": generation,
            }
        )
    return out


@dataclass(frozen=True)
class Observation:
    """Everything the status is computed from, read in one reconcile pass."""

    name: str
    namespace: str
    generation: int
    suspended: bool
    engine: Mapping[str, Any] | None  # the engine Deployment, as the API returned it
    router: Mapping[str, Any] | None
    problem: Problem | None = None
    previous: Mapping[str, Any] | None = None  # the current .status
    # Why a Deployment could not be read (the API failed), else None: its counts stay as
    # last written, and its condition is Unknown.
    engine_unread: str | None = None
    router_unread: str | None = None


def compute_status(obs: Observation, now: str) -> dict[str, Any]:
    """Our part of `.status`, ready for a merge patch."""
    suspended = obs.suspended
    e, r = rollout(obs.engine), rollout(obs.router)
    unread = [
        f"{component} Deployment unread: {why}"
        for component, why in (("engine", obs.engine_unread), ("router", obs.router_unread))
        if why is not None
    ]
    values: dict[str, Verdict] = {
        "EngineReady": _component("engine", e, suspended, obs.engine_unread),
        "RouterReady": _component("router", r, suspended, obs.router_unread),
        "Progressing": _progressing(e, r, obs.problem, suspended, unread),
        "Degraded": _degraded(e, r, obs.problem),
    }
    values["Ready"] = _ready(
        values["EngineReady"], values["RouterReady"], values["Degraded"], suspended
    )
    previous = obs.previous or {}
    generation, name, namespace = obs.generation, obs.name, obs.namespace

    def count(key: str, rollout_: Rollout | None, unread: str | None, ready: bool) -> int:
        if unread is not None:  # not known now: what was last read, not a guess
            return int(previous.get(key) or 0)
        if rollout_ is None:
            return 0
        return rollout_.ready if ready else rollout_.replicas

    return {
        "observedGeneration": generation,
        "replicas": count("replicas", e, obs.engine_unread, False),
        "readyReplicas": count("readyReplicas", e, obs.engine_unread, True),
        "routerReplicas": count("routerReplicas", r, obs.router_unread, False),
        "routerReadyReplicas": count("routerReadyReplicas", r, obs.router_unread, True),
        "selector": selector_string(name, ENGINE),
        "url": service_url(name, namespace),
        "phase": _phase(values, suspended),
        "conditions": _conditions(values, previous.get("conditions") or [], generation, now),
    }


def status_changed(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything we own (other keys are left alone)."""
    current = current or {}
    return any(current.get(key) != value for key, value in new.items())
