"""spec.autoscaling through the real handlers, run by kopf, against the emulated API (kmock).

The HPA controller is simulated the way it acts on a cluster: a merge patch of the
InferenceService's `spec.engine.replicas` (what its /scale subresource writes).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from tests.operator.cases import SMOLLM_AUTOSCALED, SMOLLM_CPU
from tests.operator.test_operator_kmock import DEPLOYMENTS, ISVCS, NS, Cluster, eventually, run
from tests.operator.test_operator_kmock import operator as running_operator

pytestmark = pytest.mark.timeout(60)

HPAS = f"/apis/autoscaling/v2/namespaces/{NS}/horizontalpodautoscalers"


async def _hpa(k8s: Cluster, check: Any = None) -> dict[str, Any] | None:
    hpa = await k8s.get(f"{HPAS}/chat")
    return hpa if hpa is not None and (check is None or check(hpa)) else None


async def _engine_replicas(k8s: Cluster) -> int | None:
    engine = await k8s.get(f"{DEPLOYMENTS}/chat-engine")
    return None if engine is None else int(engine["spec"]["replicas"])


def _target(hpa: dict[str, Any]) -> str:
    return str(hpa["spec"]["metrics"][0]["pods"]["target"]["averageValue"])


def test_hpa_is_created_owned_patched_and_follows_suspend() -> None:
    async def scenario() -> None:
        async with running_operator() as k8s:
            isvc = await k8s.create("chat", SMOLLM_AUTOSCALED)
            hpa = await eventually(lambda: _hpa(k8s), "the HPA")
            assert hpa["metadata"]["ownerReferences"][0]["uid"] == isvc["metadata"]["uid"]
            assert hpa["spec"]["scaleTargetRef"]["kind"] == "InferenceService"
            assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (2, 6)
            assert _target(hpa) == "8"
            # spec.engine.replicas is 1: the Deployment never runs below minReplicas
            assert await eventually(lambda: _engine_replicas(k8s), "engine Deployment") == 2

            change = {"autoscaling": {"targetPerReplica": 4, "maxReplicas": 10}}
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": change})
            patched = await eventually(
                lambda: _hpa(k8s, lambda h: h["spec"]["maxReplicas"] == 10), "HPA patched"
            )
            assert _target(patched) == "4"
            assert patched["metadata"]["uid"] == hpa["metadata"]["uid"]  # patched, not replaced
            # A reconcile that read the HPA before the patch landed may patch it once more;
            # once three passes have read it without a patch it has settled, and three more
            # passes over the settled HPA must not patch it.
            for _ in range(5):
                if await _patches_over_passes(k8s, 3) == 0:
                    break
            assert await _patches_over_passes(k8s, 3) == 0, "a settled HPA was patched again"

            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"suspend": True}})

            async def suspended() -> bool:
                return await k8s.get(f"{HPAS}/chat") is None and await _engine_replicas(k8s) == 0

            await eventually(suspended, "HPA deleted and engines at 0 while suspended")
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"suspend": False}})
            back = await eventually(lambda: _hpa(k8s), "HPA recreated on resume")
            assert back["metadata"]["uid"] != hpa["metadata"]["uid"]
            assert await eventually(lambda: _engine_replicas(k8s), "engines back") == 2

    run(scenario)


async def _patches_over_passes(k8s: Cluster, passes: int) -> int:
    """PATCHes of the HPA while the operator makes `passes` reconcile passes over it. Each
    pass reads the HPA before it decides whether to patch it: `passes` + 1 reads, so the
    last of the `passes` passes has finished (its patch, if any, is counted)."""
    before = k8s.requests("PATCH", "/horizontalpodautoscalers/chat")
    await k8s.more_requests("GET", "/horizontalpodautoscalers/chat", passes + 1)
    return k8s.requests("PATCH", "/horizontalpodautoscalers/chat") - before


def test_scale_writes_reach_the_deployment_within_the_bounds() -> None:
    """What the HPA writes through /scale (spec.engine.replicas) is what the engines run."""

    async def scenario() -> None:
        async with running_operator() as k8s:
            await k8s.create("chat", SMOLLM_AUTOSCALED)
            await eventually(lambda: _hpa(k8s), "the HPA")
            for asked, runs in ((5, 5), (9, 6), (3, 3)):
                scale = {"spec": {"engine": {"replicas": asked}}}
                await k8s.send("PATCH", f"{ISVCS}/chat", scale)

                async def settled(want: int = runs) -> bool:
                    return await _engine_replicas(k8s) == want

                await eventually(settled, f"engine Deployment at {runs} after /scale {asked}")

    run(scenario)


def test_autoscaling_added_then_removed_creates_then_deletes_the_hpa() -> None:
    async def scenario() -> None:
        async with running_operator() as k8s:
            await k8s.create("chat", SMOLLM_CPU)
            await eventually(lambda: k8s.get(f"/api/v1/namespaces/{NS}/services/chat"), "children")
            assert await k8s.get(f"{HPAS}/chat") is None
            autoscaling = copy.deepcopy(SMOLLM_AUTOSCALED["autoscaling"])
            autoscaling |= {"metric": "kvTokenUsage", "targetPerReplica": 0.75}
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"autoscaling": autoscaling}})
            hpa = await eventually(lambda: _hpa(k8s), "HPA after autoscaling was added")
            assert hpa["spec"]["metrics"][0]["pods"]["metric"]["name"] == (
                "radixserve_kv_token_usage"
            )
            assert _target(hpa) == "750m"

            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"autoscaling": None}})

            async def gone() -> bool:
                return await k8s.get(f"{HPAS}/chat") is None

            await eventually(gone, "HPA deleted after autoscaling was removed")
            assert await _engine_replicas(k8s) == 2  # back to spec.engine.replicas

    run(scenario)


def test_an_hpa_deleted_by_hand_is_restored_and_a_foreign_one_left_alone() -> None:
    async def scenario() -> None:
        async with running_operator() as k8s:
            theirs = {"apiVersion": "autoscaling/v2", "kind": "HorizontalPodAutoscaler"}
            theirs["metadata"] = {"name": "chat"}
            theirs["spec"] = {
                "scaleTargetRef": {"apiVersion": "apps/v1", "kind": "Deployment", "name": "x"},
                "maxReplicas": 2,
            }
            await k8s.send("POST", HPAS, theirs)
            await k8s.create("chat", SMOLLM_CPU)
            await eventually(lambda: k8s.get(f"/api/v1/namespaces/{NS}/services/chat"), "children")
            # Three passes that read it (to delete an HPA of ours the spec no longer asks
            # for): none may delete it.
            await k8s.more_requests("GET", "/horizontalpodautoscalers/chat", 3)
            assert k8s.requests("DELETE", "/horizontalpodautoscalers/chat") == 0
            left = await k8s.get(f"{HPAS}/chat")
            assert left is not None and "ownerReferences" not in left["metadata"]  # not ours

            await k8s.send("DELETE", f"{HPAS}/chat")
            spec = {"autoscaling": copy.deepcopy(SMOLLM_AUTOSCALED["autoscaling"])}
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": spec})
            first = await eventually(lambda: _hpa(k8s), "our HPA")
            await k8s.send("DELETE", f"{HPAS}/chat")

            async def restored() -> dict[str, Any] | None:
                hpa = await k8s.get(f"{HPAS}/chat")
                return hpa if hpa and hpa["metadata"]["uid"] != first["metadata"]["uid"] else None

            await eventually(restored, "HPA deleted by hand recreated by the resync")

    run(scenario)


def test_a_pd_pools_hpa_owns_its_deployments_replicas() -> None:
    """spec.decode.autoscaling: an HPA on the decode Deployment (the HPA controller is
    simulated by a merge patch of that Deployment's replicas, what its /scale writes). The
    operator never writes them back, not even when the autoscaling was added to a running
    pool; removed, the HPA goes and the pool runs its spec.decode.replicas again."""
    from tests.operator.cases import SMOLLM_PD

    async def scenario() -> None:
        async with running_operator() as k8s:
            await k8s.create("chat", SMOLLM_PD)
            decode_path = f"{DEPLOYMENTS}/chat-decode"

            async def decode_replicas() -> int | None:
                d = await k8s.get(decode_path)
                return None if d is None else d["spec"].get("replicas")

            await eventually(lambda: k8s.get(decode_path), "decode Deployment")
            assert await decode_replicas() == 2  # spec.decode.replicas
            scaling = {"minReplicas": 1, "maxReplicas": 4, "metric": "kvTokenUsage"}
            scaling["targetPerReplica"] = 0.6
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"decode": {"autoscaling": scaling}}})
            hpa = await eventually(lambda: k8s.get(f"{HPAS}/chat-decode"), "the decode's HPA")
            assert hpa["spec"]["scaleTargetRef"] == {
                "apiVersion": "apps/v1", "kind": "Deployment", "name": "chat-decode"
            }  # fmt: skip
            assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (1, 4)
            assert await k8s.get(f"{HPAS}/chat-prefill") is None
            assert await decode_replicas() == 2  # left as it was, not nulled to 1
            await k8s.send("PATCH", decode_path, {"spec": {"replicas": 3}})  # the HPA acts
            # a later pass (a spec change) leaves the HPA's count alone
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"prefill": {"replicas": 2}}})

            async def prefill_two() -> bool:
                d = await k8s.get(f"{DEPLOYMENTS}/chat-prefill")
                return d is not None and d["spec"]["replicas"] == 2

            await eventually(prefill_two, "the prefill patched to 2")
            assert await decode_replicas() == 3
            await k8s.send("PATCH", f"{ISVCS}/chat", {"spec": {"decode": {"autoscaling": None}}})

            async def hpa_gone_and_spec_back() -> bool:
                hpa = await k8s.get(f"{HPAS}/chat-decode")
                return hpa is None and await decode_replicas() == 2

            await eventually(hpa_gone_and_spec_back, "HPA deleted, spec.decode.replicas again")

    run(scenario)
