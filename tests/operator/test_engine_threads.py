"""A CPU engine pod's torch threads follow its CPU request: the operator writes OMP_NUM_THREADS
(the request sets no quota the engine could read), and the engine, parsing the pod's own
command line with that environment, runs that many threads per rank."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from radixserve.engine.configs.cli_args import server_args_from_namespace
from radixserve.operator.engine_manifests import engine_container
from radixserve.operator.spec import parse_spec, quantity_value
from tests.operator.cases import SMOLLM_CPU, SMOLLM_PD
from tests.operator.test_builders import _engine_namespace

IMAGE = "radixserve/engine:test"


def _container(engine: dict[str, Any]) -> dict[str, Any]:
    case = copy.deepcopy(SMOLLM_CPU)
    case["engine"].update(engine)
    return engine_container(parse_spec(case, "chat"), IMAGE)


def _env(container: dict[str, Any]) -> list[tuple[str, str]]:
    return [(e["name"], e["value"]) for e in container["env"] if "value" in e]


def test_quantities_read_as_kubernetes_reads_them() -> None:
    cases = {
        "2": 2,
        "500m": 0.5,
        "2.5": 2.5,
        "1e1": 10,
        "1k": 1000,
        "2Gi": 2**31,
        "100Mi": 100 * 2**20,
    }
    assert {text: quantity_value(text) for text in cases} == cases


@pytest.mark.parametrize(
    ("cpu", "parallelism", "threads"),
    [
        (2, {}, 2),
        ("500m", {}, 1),  # less than one CPU still runs a thread
        ("2.5", {}, 2),  # a thread on half a CPU stalls every parallel region
        ("1e1", {}, 10),
        ("8", {"tp": 2}, 4),
        ("8", {"tp": 2, "dp": 2}, 2),  # plain DP: tp × dp processes
        ("8", {"tp": 4, "dp": 2, "dpAttention": True}, 2),  # DP attention: tp processes
        ("3", {"tp": 4}, 1),
    ],
)
def test_a_cpu_pod_runs_the_threads_it_requested(
    monkeypatch: pytest.MonkeyPatch, cpu: Any, parallelism: dict[str, Any], threads: int
) -> None:
    container = _container({"resources": {"cpu": cpu}, "parallelism": parallelism})
    env = dict(_env(container))
    assert env["OMP_NUM_THREADS"] == str(threads)
    monkeypatch.setenv("OMP_NUM_THREADS", env["OMP_NUM_THREADS"])
    args = server_args_from_namespace(_engine_namespace(container["args"]))
    assert args.cpu_threads_per_rank == threads


def test_the_users_thread_count_wins_and_gpu_or_unsized_pods_get_none() -> None:
    user = {"name": "OMP_NUM_THREADS", "value": "12"}
    container = _container({"resources": {"cpu": "4"}, "env": [user]})
    assert [v for name, v in _env(container) if name == "OMP_NUM_THREADS"] == ["12"]
    for engine in (
        {"resources": {"memory": "4Gi"}},
        {"device": "cuda", "resources": {"cpu": "16"}},
    ):
        assert "OMP_NUM_THREADS" not in dict(_env(_container(engine)))


def test_each_pd_pool_sizes_its_threads_from_its_own_request_and_ranks() -> None:
    prefill = {**SMOLLM_PD["prefill"], "resources": {"cpu": "8"}, "parallelism": {"tp": 2}}
    decode = {**SMOLLM_PD["decode"], "resources": {"cpu": "3"}}
    spec = parse_spec({**SMOLLM_PD, "prefill": prefill, "decode": decode}, "chat")
    for role, threads in (("prefill", "4"), ("decode", "3")):
        container = engine_container(spec.for_role(role), IMAGE, role)
        assert dict(_env(container))["OMP_NUM_THREADS"] == threads, role
