"""Every kind of child the operator builds is also watched, found and removed alike.

The operator's resync daemon wakes on a watch event of any child; a kind without a watcher is
repaired only at the periodic resync. These tests run the real handlers under kopf against
the emulated API (kmock) with a resync period of an hour, so only a watch can wake them.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from radixserve.operator.builders import build_children, child_refs
from radixserve.operator.config import OperatorConfig
from radixserve.operator.handlers import Runtime
from radixserve.operator.kinds import child_kinds
from radixserve.operator.meta import Owner
from radixserve.operator.spec import parse_spec
from tests.operator.cases import CASES, SMOLLM_AUTOSCALED, UID
from tests.operator.test_operator_kmock import CHILDREN, NS, Cluster, eventually, run
from tests.operator.test_operator_kmock import operator as running_operator

pytestmark = pytest.mark.timeout(60)

NETWORK_POLICY = f"/apis/networking.k8s.io/v1/namespaces/{NS}/networkpolicies/chat-engine"
HPA = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers/chat"
# Only a watch event can wake the resync daemon within a test's time.
WATCH_ONLY = OperatorConfig(resync_seconds=3600, network_policy=True)


class Idle:
    """Spies on the operator's wake-ups and resync passes (their behaviour unchanged), to tell
    when it is idle: the latest change of every child delivered to it, no pass running and
    none pending. kopf hands each watch event over a moment late (its batch window), so a
    pass woken by the operator's own writes could otherwise repair an edit made after them,
    whatever kind that edit is of."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.delivered: set[tuple[str, str]] = set()  # (uid, resourceVersion)
        self.running = 0
        self.wakeups: dict[Any, asyncio.Event] = {}
        child_event, resync = Runtime.child_event, Runtime.resync

        async def delivered(rt: Runtime, **kwargs: Any) -> None:
            meta = kwargs["body"]["metadata"]
            self.delivered.add((meta["uid"], meta["resourceVersion"]))
            await child_event(rt, **kwargs)  # sets the wake-up it looks at (shared dict)
            self.wakeups = rt.wakeups

        async def resyncing(rt: Runtime, *args: Any, **kwargs: Any) -> None:
            self.wakeups, self.running = rt.wakeups, self.running + 1
            try:
                await resync(rt, *args, **kwargs)
            finally:
                self.running -= 1

        monkeypatch.setattr(Runtime, "child_event", delivered)
        monkeypatch.setattr(Runtime, "resync", resyncing)

    async def _versions(self, k8s: Cluster, paths: list[str]) -> set[tuple[str, str]] | None:
        found = [await k8s.get(path) for path in paths]
        metas = [obj["metadata"] for obj in found if obj is not None]
        return (
            {(m["uid"], m["resourceVersion"]) for m in metas} if len(metas) == len(paths) else None
        )

    async def reached(self, k8s: Cluster, paths: list[str]) -> bool:
        """Idle over `paths`, twice running with no child changed in between (so no write
        of a pass that ended meanwhile is still on its way to the operator)."""
        before = await self._versions(k8s, paths)
        asleep = self.running == 0 and not any(w.is_set() for w in self.wakeups.values())
        after = await self._versions(k8s, paths)
        return bool(asleep and before and before == after and after <= self.delivered)


def _collection(path: str) -> str:
    """A namespaced collection's path as a cluster-wide watch asks for it."""
    return path.replace(f"/namespaces/{NS}/", "/")


def _created_collections(k8s: Cluster) -> set[str]:
    """The collections the operator has created children in (the InferenceService and its
    Events are the test's and kopf's)."""
    paths = {_collection(r.url.path) for r in k8s.api if r.method == "POST"}
    return {p for p in paths if not p.endswith(("/inferenceservices", "/events"))}


def _watched_collections(k8s: Cluster) -> set[str]:
    return {r.url.path for r in k8s.api if r.method == "GET" and r.params.get("watch") == "true"}


def test_the_operator_watches_every_kind_it_creates() -> None:
    """Judged by the requests the API server saw, not by the operator's own tables."""

    async def scenario() -> None:
        async with running_operator(WATCH_ONLY) as k8s:
            await k8s.create("chat", SMOLLM_AUTOSCALED)
            await eventually(lambda: k8s.get(HPA), "the HPA, the last child built")
            created = _created_collections(k8s)
            assert len(created) == 7, created  # every kind, the NetworkPolicy and HPA too

            async def all_watched() -> bool:
                return created <= _watched_collections(k8s)

            try:
                await eventually(all_watched, "a watch on every created kind", timeout=5)
            except AssertionError:
                missing = created - _watched_collections(k8s)
                raise AssertionError(f"created but never watched: {sorted(missing)}") from None

    run(scenario)


def test_a_hand_edited_network_policy_is_repaired_on_its_own_event(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Someone opens the engines to every pod: the operator restores the policy long before
    the hour-long resync, because the edit itself wakes it."""
    idle = Idle(monkeypatch)

    async def scenario() -> None:
        async with running_operator(WATCH_ONLY) as k8s:
            await k8s.create("chat", SMOLLM_AUTOSCALED)
            built = await eventually(lambda: k8s.get(NETWORK_POLICY), "the NetworkPolicy")
            # Every other child settled: nothing but the edit can wake a pass now.
            await eventually(lambda: idle.reached(k8s, [*CHILDREN, HPA]), "the operator idle")
            await k8s.send("PATCH", NETWORK_POLICY, {"spec": {"ingress": [{}]}})

            async def restored() -> dict[str, Any] | None:
                policy = await k8s.get(NETWORK_POLICY)
                ingress = (policy or {}).get("spec", {}).get("ingress")
                return policy if ingress == built["spec"]["ingress"] else None

            repaired = await eventually(restored, "the NetworkPolicy's ingress restored")
            assert repaired["metadata"]["uid"] == built["metadata"]["uid"]  # patched in place

    run(scenario)


@pytest.mark.parametrize("network_policy", [False, True])
@pytest.mark.parametrize("case", sorted(CASES))
def test_children_are_of_the_kinds_the_operator_watches(case: str, network_policy: bool) -> None:
    """What the builders make, what the prune and delete passes look for (`child_refs`) and
    what the handlers watch (`child_kinds`) are the same kinds, for either setting."""
    config = OperatorConfig(network_policy=network_policy)
    owner = Owner(name="chat", namespace=NS, uid=UID)
    children = build_children(owner, parse_spec(CASES[case], owner.name), config)
    watched = {(kind.api_version, kind.kind) for kind in child_kinds(config)}
    assert {(c["apiVersion"], c["kind"]) for c in children} <= watched
    assert {(api_version, kind) for api_version, kind, _ in child_refs("chat", config)} == watched
    built = {(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in children}
    assert built <= set(child_refs("chat", config))
