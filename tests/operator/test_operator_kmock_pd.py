"""The operator's real handlers (kopf, against the kmock API emulator) on an InferenceService
with prefill and decode pools: each pool's Deployment and Service, the router in PD mode over
both, PrefillReady / DecodeReady and per-role counts in the status, and a pair whose KV pages
cannot agree refused before anything is created (Degraded, naming the field)."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from radixserve.operator.schema import ROLES
from tests.operator.cases import SMOLLM_PD
from tests.operator.test_operator_kmock import (
    DEPLOYMENTS,
    ISVCS,
    SERVICES,
    condition,
    eventually,
    operator,
    run,
)

pytestmark = pytest.mark.timeout(60)


def _args(deployment: dict[str, Any] | None) -> list[str]:
    args: list[str] = (deployment or {})["spec"]["template"]["spec"]["containers"][0]["args"]
    return args


def test_pd_pools_are_created_and_their_readiness_is_reported() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            await k8s.create("chat", SMOLLM_PD)
            prefill = await eventually(lambda: k8s.get(f"{DEPLOYMENTS}/chat-prefill"), "prefill")
            decode = await eventually(lambda: k8s.get(f"{DEPLOYMENTS}/chat-decode"), "decode")
            router = await eventually(lambda: k8s.get(f"{DEPLOYMENTS}/chat-router"), "router")
            assert _args(prefill)[_args(prefill).index("--disaggregation-mode") + 1] == "prefill"
            assert _args(decode)[_args(decode).index("--disaggregation-mode") + 1] == "decode"
            rargs = _args(router)
            assert "--pd-disaggregation" in rargs and "--k8s-service" not in rargs
            assert rargs[rargs.index("--k8s-prefill-service") + 1] == "chat-prefill"
            assert rargs[rargs.index("--k8s-decode-service") + 1] == "chat-decode"
            service = await eventually(lambda: k8s.get(f"{SERVICES}/chat-prefill"), "service")
            assert {p["name"]: p["port"] for p in service["spec"]["ports"]}["bootstrap"] == 8998
            assert await k8s.get(f"{DEPLOYMENTS}/chat-engine") is None

            async def reported() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return isvc if condition(isvc, "DecodeReady") else None

            first = await eventually(reported, "PrefillReady / DecodeReady")
            assert condition(first, "PrefillReady")["status"] == "False"
            await k8s.set_ready("chat-prefill", 1)
            await k8s.set_ready("chat-decode", 1)
            await k8s.set_ready("chat-router", 1)

            async def counted() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                status = (isvc or {}).get("status") or {}
                counts = [(status.get(role) or {}).get("readyReplicas") for role in ROLES]
                return isvc if counts == [1, 1] else None  # one pass that saw both patches

            partly = await eventually(counted, "both pools' counts")
            assert condition(partly, "PrefillReady")["status"] == "True"
            assert condition(partly, "DecodeReady")["reason"] == "ReplicasNotReady"  # 1 of 2
            assert condition(partly, "Ready")["status"] == "False"
            await k8s.set_ready("chat-decode", 2)

            async def ready() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return isvc if condition(isvc, "Ready").get("status") == "True" else None

            done = await eventually(ready, "Ready=True")
            assert done["status"]["prefill"] == {"replicas": 1, "readyReplicas": 1}
            assert done["status"]["decode"] == {"replicas": 2, "readyReplicas": 2}

    run(scenario)


def test_a_pair_whose_pages_disagree_is_refused_before_anything_runs() -> None:
    async def scenario() -> None:
        async with operator() as k8s:
            spec = copy.deepcopy(SMOLLM_PD)
            spec["decode"]["kvCache"]["pageSize"] = 1
            await k8s.create("chat", spec)

            async def degraded() -> dict[str, Any] | None:
                isvc = await k8s.get(f"{ISVCS}/chat")
                return isvc if condition(isvc, "Degraded").get("status") == "True" else None

            isvc = await eventually(degraded, "Degraded")
            cond = condition(isvc, "Degraded")
            assert cond["reason"] == "InvalidSpec"
            assert (
                "spec.decode.kvCache" in cond["message"]
                and "prefill 16, decode 1" in (cond["message"])
            )
            for name in ("chat-prefill", "chat-decode", "chat-router"):
                assert await k8s.get(f"{DEPLOYMENTS}/{name}") is None

    run(scenario)
