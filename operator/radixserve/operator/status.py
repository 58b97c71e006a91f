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
# with spec.prefill / spec.decode, after those: PrefillReady, DecodeReady (EngineReady is both)


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
    rollouts: Sequence[Rollout | None],
    problem: Problem | None,
    suspended: bool,
    unread: Sequence[str],
) -> Verdict:
    if problem is not None and problem.reason == "InvalidSpec":
        return False, "InvalidSpec", "the spec is not applied"
    if unread:
        return None, "ReadFailed", "; ".join(unread)
    pending = [r for r in rollouts if r is None or not r.settled]
    if not pending:
        return False, "Suspended" if suspended else "Complete", "every Deployment is settled"
    parts = [
        f"{r.name}: {r.updated}/{r.desired} updated, {r.ready} ready" if r else "creating"
        for r in pending
    ]
    return True, "RollingOut", "; ".join(parts)


def _degraded(rollouts: Sequence[Rollout | None], problem: Problem | None) -> Verdict:
    if problem is not None:
        return True, problem.reason, problem.message
    for r in rollouts:
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
    kinds: Sequence[str] = CONDITIONS,
) -> list[dict[str, Any]]:
    before = {c.get("type"): c for c in previous}
    out = []
    for kind in kinds:
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
    # prefill/decode pools (spec.prefill / spec.decode): role → (its Deployment, why unread);
    # then they stand in for the engine Deployment
    pools: Mapping[str, tuple[Mapping[str, Any] | None, str | None]] | None = None


def _pools_verdict(verdicts: Sequence[Verdict]) -> Verdict:
    """EngineReady of prefill/decode pools: ready when both are."""
    for verdict in verdicts:
        if verdict[0] is not True:
            return verdict
    return True, "ReplicasReady", "; ".join(v[2] for v in verdicts)


COUNT_KEYS = ("replicas", "readyReplicas")


def _counts(roll: Rollout | None) -> dict[str, int]:
    """A Deployment's replica counts as the status shows them (none yet: zeros)."""
    if roll is None:
        return {"replicas": 0, "readyReplicas": 0}
    return {"replicas": roll.replicas, "readyReplicas": roll.ready}


def compute_status(obs: Observation, now: str) -> dict[str, Any]:
    """Our part of `.status`, ready for a merge patch."""
    suspended = obs.suspended
    e, r = rollout(obs.engine), rollout(obs.router)
    pools = {role: (rollout(dep), why) for role, (dep, why) in (obs.pools or {}).items()}
    engines = [roll for roll, _ in pools.values()] if pools else [e]
    sources = (
        [(role, why) for role, (_, why) in pools.items()]
        if pools
        else [("engine", obs.engine_unread)]
    )
    unread = [
        f"{component} Deployment unread: {why}"
        for component, why in [*sources, ("router", obs.router_unread)]
        if why is not None
    ]
    role_verdicts = {
        f"{role.capitalize()}Ready": _component(role, roll, suspended, why)
        for role, (roll, why) in pools.items()
    }
    engine_verdict = (
        _pools_verdict(list(role_verdicts.values()))
        if pools
        else _component("engine", e, suspended, obs.engine_unread)
    )
    values: dict[str, Verdict] = {
        "EngineReady": engine_verdict,
        "RouterReady": _component("router", r, suspended, obs.router_unread),
        "Progressing": _progressing([*engines, r], obs.problem, suspended, unread),
        "Degraded": _degraded([*engines, r], obs.problem),
        **role_verdicts,
    }
    values["Ready"] = _ready(
        values["EngineReady"], values["RouterReady"], values["Degraded"], suspended
    )
    previous = obs.previous or {}
    generation, name, namespace = obs.generation, obs.name, obs.namespace
    # A Deployment that could not be read leaves its counts out of the merge patch: the server
    # keeps what it last stored. Copying them from the handler's body instead could write back
    # an older status than the server's (kopf may hand a handler a body from before the last
    # write), and a zero would be a guess.
    counts: dict[str, Any] = {}
    per_role = {role: _counts(roll) for role, (roll, why) in pools.items() if why is None}
    if pools:
        counts.update(per_role)
        if len(per_role) == len(pools):  # the pools' sums stand in for the engine's
            counts.update({k: sum(c[k] for c in per_role.values()) for k in COUNT_KEYS})
    elif obs.engine_unread is None:
        counts.update(_counts(e))
    if obs.router_unread is None:
        router = _counts(r)
        counts.update(
            routerReplicas=router["replicas"], routerReadyReplicas=router["readyReplicas"]
        )
    kinds = (*CONDITIONS, *role_verdicts)
    return {
        "observedGeneration": generation,
        **counts,
        "selector": selector_string(name, ENGINE),
        "url": service_url(name, namespace),
        "phase": _phase(values, suspended),
        "conditions": _conditions(values, previous.get("conditions") or [], generation, now, kinds),
    }


def status_changed(current: Mapping[str, Any] | None, new: Mapping[str, Any]) -> bool:
    """Whether writing `new` would change anything we own (other keys are left alone)."""
    current = current or {}
    return any(current.get(key) != value for key, value in new.items())
