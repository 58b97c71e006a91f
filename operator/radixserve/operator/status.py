"""InferenceService status from what the children report: a pure function of the two
Deployments (as read from the API), the spec's fate, and the previous status.

Conditions follow Kubernetes conventions: each has a CamelCase reason, a human message, the
generation it describes, and a lastTransitionTime that moves only when its status flips.
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


def _component(component: str, r: Rollout | None, suspended: bool) -> tuple[bool, str, str]:
    """(ready, reason, message) of EngineReady / RouterReady."""
    if r is None:
        return False, "NotCreated", f"the {component} Deployment does not exist yet"
    if r.desired == 0:
        reason = "Suspended" if suspended else "ScaledToZero"
        return False, reason, f"{r.name} is scaled to zero"
    if r.ready >= r.desired:
        return True, "ReplicasReady", r.summary(component)
    return False, "ReplicasNotReady", r.summary(component)


def _progressing(
    engine: Rollout | None, router: Rollout | None, problem: Problem | None, suspended: bool
) -> tuple[bool, str, str]:
    if problem is not None and problem.reason == "InvalidSpec":
        return False, "InvalidSpec", "the spec is not applied"
    pending = [r for r in (engine, router) if r is None or not r.settled]
    if not pending:
        return False, "Suspended" if suspended else "Complete", "every Deployment is settled"
    parts = [
        f"{r.name}: {r.updated}/{r.desired} updated, {r.ready} ready" if r else "creating"
        for r in pending
    ]
    return True, "RollingOut", "; ".join(parts)


def _degraded(
    engine: Rollout | None, router: Rollout | None, problem: Problem | None
) -> tuple[bool, str, str]:
    if problem is not None:
        return True, problem.reason, problem.message
    for r in (engine, router):
        if r is not None and r.stalled:
            return True, "ProgressDeadlineExceeded", f"{r.name}: {r.stalled}"
    return False, "AsExpected", "no problem found"


def _ready(
    engine: tuple[bool, str, str],
    router: tuple[bool, str, str],
    degraded: tuple[bool, str, str],
    suspended: bool,
) -> tuple[bool, str, str]:
    if degraded[0]:
        return False, degraded[1], degraded[2]
    if suspended:
        return False, "Suspended", "spec.suspend is true"
    if not engine[0]:
        return False, "EngineNotReady", engine[2]
    if not router[0]:
        return False, "RouterNotReady", router[2]
    return True, "Ready", f"{engine[2]}; {router[2]}"


def _phase(conds: Mapping[str, tuple[bool, str, str]], suspended: bool) -> str:
    if conds["Degraded"][0]:
        return "Degraded"
    if suspended:
        return "Suspended"
    if conds["Ready"][0]:
        return "Ready"
    return "Progressing" if conds["Progressing"][0] else "Pending"


def _conditions(
    values: Mapping[str, tuple[bool, str, str]],
    previous: Sequence[Mapping[str, Any]],
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for kind in CONDITIONS:
        ok, reason, message = values[kind]
        status = "True" if ok else "False"
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


def compute_status(obs: Observation, now: str) -> dict[str, Any]:
    """Our part of `.status`, ready for a merge patch."""
    suspended = obs.suspended
    e, r = rollout(obs.engine), rollout(obs.router)
    values: dict[str, tuple[bool, str, str]] = {
        "EngineReady": _component("engine", e, suspended),
        "RouterReady": _component("router", r, suspended),
        "Progressing": _progressing(e, r, obs.problem, suspended),
        "Degraded": _degraded(e, r, obs.problem),
    }
    values["Ready"] = _ready(
        values["EngineReady"], values["RouterReady"], values["Degraded"], suspended
    )
    previous = obs.previous or {}
    generation, name, namespace = obs.generation, obs.name, obs.namespace
    return {
        "observedGeneration": generation,
        "replicas": e.replicas if e else 0,
        "readyReplicas": e.ready if e else 0,
        "routerReplicas": r.replicas if r else 0,
        "routerReadyReplicas": r.ready if r else 0,
        "selector": selector_string(name, ENGINE),
        "url": service_url(name, namespace),
        "phase": _phase(values, suspended),
        "conditions": _conditions(values, previous.get("conditions") or [], generation, now),
    }


def status_changed(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything we own (other keys are left alone)."""
    current = current or {}
    return any(current.get(key) != value for key, value in new.items())
