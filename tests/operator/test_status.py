"""Status: conditions, phase and counts computed from the Deployments' own reports."""

from __future__ import annotations

from typing import Any

from radixserve.operator.status import Observation, Problem, compute_status, status_changed


def deployment(name: str, desired: int, ready: int, gen: int = 1, seen: int = 1) -> dict[str, Any]:
    status = {"replicas": desired, "readyReplicas": ready, "updatedReplicas": desired}
    status["observedGeneration"] = seen
    return {
        "metadata": {"name": name, "generation": gen},
        "spec": {"replicas": desired},
        "status": status,
    }


def conditions(status: dict[str, Any]) -> dict[str, tuple[str, str]]:
    return {c["type"]: (c["status"], c["reason"]) for c in status["conditions"]}


def observe(**kwargs: Any) -> Observation:
    base: dict[str, Any] = {"name": "chat", "namespace": "llm", "generation": 4}
    base |= {"suspended": False, "engine": None, "router": None}
    return Observation(**(base | kwargs))


def test_nothing_created_yet_is_pending_progress() -> None:
    status = compute_status(observe(), "2026-01-01T00:00:00Z")
    assert conditions(status)["EngineReady"] == ("False", "NotCreated")
    assert conditions(status)["Progressing"][0] == "True"
    assert status["phase"] == "Progressing"
    assert status["observedGeneration"] == 4
    assert status["url"] == "http://chat.llm.svc.cluster.local:80"
    assert status["selector"] == (
        "app.kubernetes.io/component=engine,app.kubernetes.io/instance=chat,"
        "app.kubernetes.io/name=radixserve"
    )


def test_ready_when_every_replica_is_ready() -> None:
    obs = observe(engine=deployment("chat-engine", 2, 2), router=deployment("chat-router", 1, 1))
    status = compute_status(obs, "t1")
    assert conditions(status) == {
        "Ready": ("True", "Ready"),
        "EngineReady": ("True", "ReplicasReady"),
        "RouterReady": ("True", "ReplicasReady"),
        "Progressing": ("False", "Complete"),
        "Degraded": ("False", "AsExpected"),
    }
    assert (status["phase"], status["replicas"], status["readyReplicas"]) == ("Ready", 2, 2)


def test_partly_ready_engine_and_unseen_generation_are_progressing() -> None:
    obs = observe(
        engine=deployment("chat-engine", 3, 2, gen=2, seen=1),
        router=deployment("chat-router", 1, 1),
    )
    status = compute_status(obs, "t1")
    assert conditions(status)["Ready"] == ("False", "EngineNotReady")
    assert conditions(status)["Progressing"] == ("True", "RollingOut")
    ready = next(c for c in status["conditions"] if c["type"] == "EngineReady")
    assert ready["message"] == "2/3 engine replicas ready"


def test_stalled_rollout_and_invalid_spec_are_degraded() -> None:
    engine = deployment("chat-engine", 1, 0)
    engine["status"]["conditions"] = [
        {"type": "Progressing", "status": "False", "reason": "ProgressDeadlineExceeded"}
    ]
    status = compute_status(observe(engine=engine), "t")
    assert conditions(status)["Degraded"] == ("True", "ProgressDeadlineExceeded")
    assert status["phase"] == "Degraded"

    bad = compute_status(observe(problem=Problem("InvalidSpec", "spec.x: no")), "t")
    assert conditions(bad)["Degraded"] == ("True", "InvalidSpec")
    assert conditions(bad)["Ready"] == ("False", "InvalidSpec")
    assert conditions(bad)["Progressing"] == ("False", "InvalidSpec")


def test_suspended_phase() -> None:
    obs = observe(
        suspended=True,
        engine=deployment("chat-engine", 0, 0),
        router=deployment("chat-router", 0, 0),
    )
    status = compute_status(obs, "t")
    assert status["phase"] == "Suspended"
    assert conditions(status)["EngineReady"] == ("False", "Suspended")
    assert conditions(status)["Progressing"] == ("False", "Suspended")


def test_transition_times_move_only_on_flips() -> None:
    engine, router = deployment("chat-engine", 1, 1), deployment("chat-router", 1, 1)
    first = compute_status(observe(engine=engine, router=router), "t1")
    same = compute_status(observe(engine=engine, router=router, previous=first), "t2")
    assert same == first
    assert not status_changed(first, same)
    down = compute_status(
        observe(engine=deployment("chat-engine", 1, 0), router=router, previous=first), "t3"
    )
    times = {c["type"]: c["lastTransitionTime"] for c in down["conditions"]}
    assert times["EngineReady"] == "t3" and times["Ready"] == "t3"
    assert times["RouterReady"] == "t1" and times["Degraded"] == "t1"
    assert status_changed(first, down)


def test_a_deployment_that_cannot_be_read_is_unknown_and_leaves_its_counts_alone() -> None:
    engine, router = deployment("chat-engine", 3, 2), deployment("chat-router", 1, 1)
    before = compute_status(observe(engine=engine, router=router), "t1")
    assert (before["replicas"], before["readyReplicas"]) == (3, 2)
    why = "HTTP 500 InternalError: etcd timeout"
    blind = compute_status(observe(router=router, engine_unread=why, previous=before), "t2")
    assert conditions(blind)["EngineReady"] == ("Unknown", "ReadFailed")
    assert conditions(blind)["Progressing"] == ("Unknown", "ReadFailed")
    assert conditions(blind)["RouterReady"] == ("True", "ReplicasReady")
    assert conditions(blind)["Ready"] == ("Unknown", "ReadFailed")  # never a guess
    assert blind["phase"] == "Pending"
    engine_ready = next(c for c in blind["conditions"] if c["type"] == "EngineReady")
    assert why in engine_ready["message"]
    # out of the merge patch: the server keeps what it last stored (the scale subresource and
    # an HPA read these), never a zero and never the counts of an older body
    assert "replicas" not in blind and "readyReplicas" not in blind
    assert (blind["routerReplicas"], blind["routerReadyReplicas"]) == (1, 1)
    # a router known not ready decides Ready, whatever the engine is
    down = compute_status(
        observe(router=deployment("chat-router", 1, 0), engine_unread=why, previous=before), "t3"
    )
    assert conditions(down)["Ready"] == ("False", "RouterNotReady")
    # nothing read: no count at all, not a guess
    first = compute_status(observe(engine_unread=why, router_unread=why), "t5")
    assert not {"replicas", "readyReplicas", "routerReplicas", "routerReadyReplicas"} & set(first)


def test_a_failed_apply_is_degraded_naming_the_step() -> None:
    step = "apply Deployment/chat-engine failed: HTTP 500 InternalError; will retry"
    engine, router = deployment("chat-engine", 1, 1), deployment("chat-router", 1, 1)
    status = compute_status(
        observe(engine=engine, router=router, problem=Problem("ApplyFailed", step)), "t"
    )
    assert conditions(status)["Degraded"] == ("True", "ApplyFailed")
    assert conditions(status)["Ready"] == ("False", "ApplyFailed")
    assert status["phase"] == "Degraded"
    degraded = next(c for c in status["conditions"] if c["type"] == "Degraded")
    assert degraded["message"] == step and degraded["observedGeneration"] == 4
    assert (status["replicas"], status["readyReplicas"]) == (1, 1)  # as the Deployment says


def test_pd_pools_get_their_own_conditions_and_counts() -> None:
    pools = {
        "prefill": (deployment("chat-prefill", 1, 1), None),
        "decode": (deployment("chat-decode", 2, 1), None),
    }
    obs = observe(router=deployment("chat-router", 1, 1), pools=pools)
    status = compute_status(obs, "t1")
    conds = conditions(status)
    assert conds["PrefillReady"] == ("True", "ReplicasReady")
    assert conds["DecodeReady"] == ("False", "ReplicasNotReady")
    assert conds["EngineReady"] == ("False", "ReplicasNotReady")  # both pools, or not ready
    assert conds["Ready"] == ("False", "EngineNotReady")
    assert status["prefill"] == {"replicas": 1, "readyReplicas": 1}
    assert status["decode"] == {"replicas": 2, "readyReplicas": 1}
    assert (status["replicas"], status["readyReplicas"]) == (3, 2)
    pools["decode"] = (deployment("chat-decode", 2, 2), None)
    ready = compute_status(observe(router=deployment("chat-router", 1, 1), pools=pools), "t2")
    assert conditions(ready)["Ready"] == ("True", "Ready") and ready["phase"] == "Ready"
    unread = {**pools, "decode": (None, "timeout")}
    kept = compute_status(observe(router=None, pools=unread, previous=ready), "t3")
    assert conditions(kept)["DecodeReady"][0] == "Unknown"
    # the unread pool's counts, and the engine's sums that need them, are left to the server
    assert "decode" not in kept and "replicas" not in kept
    assert kept["prefill"] == {"replicas": 1, "readyReplicas": 1}
