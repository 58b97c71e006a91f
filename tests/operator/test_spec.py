"""Spec validation: every bad value is refused with an error naming its field; defaults and
valid specs come through as frozen dataclasses."""

from __future__ import annotations

import copy
import dataclasses
from typing import Any

import pytest

from radixserve.operator.schema import (
    BuiltinSource,
    HostPathSource,
    HuggingFaceSource,
    Parallelism,
    PvcSource,
    SpecError,
)
from radixserve.operator.spec import parse_spec
from tests.operator.cases import CASES, SMOLLM_PD, SMOLLM_PD_AUTOSCALED, spec_with

MODEL = {"name": "m", "source": {"builtin": "smollm2-135m"}}


def test_minimal_spec_gets_the_crd_defaults() -> None:
    spec = parse_spec({"model": MODEL}, "chat")
    assert spec.engine.replicas == 1 and spec.engine.device == "cpu"
    assert spec.engine.parallelism == Parallelism(1, 1, 1, False)
    assert (spec.router.replicas, spec.router.policy) == (1, "cache_aware")
    r = spec.router
    assert (r.cache_threshold, r.balance_abs_threshold, r.balance_rel_threshold) == (0.3, 64, 1.5)
    assert spec.suspend is False
    assert spec.engine.gpus == 0
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.engine.replicas = 3  # type: ignore[misc]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ({"builtin": "smollm2-135m"}, BuiltinSource("smollm2-135m")),
        ({"pvc": {"claimName": "c", "path": "m/x"}}, PvcSource("c", "m/x")),
        ({"hostPath": "/data/m.gguf"}, HostPathSource("/data/m.gguf")),
        ({"huggingFace": {"repo": "Qwen/Qwen3-0.6B"}}, HuggingFaceSource("Qwen/Qwen3-0.6B", None)),
    ],
)
def test_each_model_source(source: dict[str, Any], expected: Any) -> None:
    assert parse_spec({"model": {"name": "m", "source": source}}, "x").model.source == expected


@pytest.mark.parametrize("case", sorted(CASES))
def test_sample_specs_parse(case: str) -> None:
    parse_spec(CASES[case], "chat")


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        ("engine.parallelism", {"tp": 4, "dp": 3, "dpAttention": True}, "parallelism.dp"),
        ("engine.parallelism", {"tp": 2, "dp": 1, "ep": 4}, "parallelism.ep"),
        ("engine.parallelism", {"tp": 0}, "parallelism.tp"),
        ("engine.replicas", -1, "engine.replicas"),
        ("engine.replicas", "2", "engine.replicas"),
        ("engine.replicas", True, "engine.replicas"),
        ("engine.device", "tpu", "engine.device"),
        ("engine.resources", {"gpus": 1}, "resources.gpus"),
        ("engine.resources", {"memory": "lots"}, "resources.memory"),
        ("engine.kvCache", {"memoryFraction": 1.0}, "kvCache.memoryFraction"),
        ("engine.kvCache", {"pageSize": 0}, "kvCache.pageSize"),
        ("engine.kvCache", {"offload": {"hostRatio": 0}}, "offload.hostRatio"),
        ("engine.kvCache", {"offload": {"hostRatio": "2"}}, "offload.hostRatio"),
        ("engine.kvCache", {"offload": {"hostRatio": 2, "hostSizeGB": 1}}, "offload.hostSizeGB"),
        ("engine.kvCache", {"offload": {"writePolicy": "lazy"}}, "offload.writePolicy"),
        ("engine.kvCache", {"offload": {"storage": {"file": {}}}}, "file.sizeGB"),
        (
            "engine.kvCache",
            {"offload": {"storage": {"mooncake": {"segmentSizeGB": 0}}}},
            "mooncake.segmentSizeGB",
        ),
        ("engine.kvCache", {"offload": {"storage": {"s3": {}}}}, "storage.s3"),
        ("engine.kvCache", {"offload": {"hostGB": 1}}, "offload.hostGB"),
        ("engine.scheduler", {"policy": "sjf"}, "scheduler.policy"),
        ("engine.scheduler", {"chunkedPrefillSize": 0}, "scheduler.chunkedPrefillSize"),
        ("engine.extraArgs", ["--port=1234"], "extraArgs[0]"),
        ("engine.extraArgs", ["--log-level", "--tp-size", "2"], "extraArgs[1]"),
        ("engine.env", [{"name": "A", "value": 1}], "env[0].value"),
        ("engine.env", [{"value": "x"}], "env[0].name"),
        ("engine.nodeSelector", {"zone": 1}, "nodeSelector.zone"),
        ("engine.tolerations", [{"operator": "Maybe"}], "tolerations[0].operator"),
        ("engine.replics", 2, "engine.replics"),
        ("router.policy", "fastest", "router.policy"),
        ("router.replicas", 0, "router.replicas"),
        ("router.cacheAware", {"cacheThreshold": 1.5}, "cacheAware.cacheThreshold"),
        ("router.cacheAware", {"balanceRelThreshold": 0.5}, "cacheAware.balanceRelThreshold"),
        ("suspend", "yes", "spec.suspend"),
        ("model.source", {}, "model.source"),
        ("model.source", {"builtin": "a", "hostPath": "/b"}, "model.source"),
        ("model.source", {"hostPath": "relative/path"}, "source.hostPath"),
        ("model.source", {"pvc": {"claimName": "c", "path": "../up"}}, "pvc.path"),
        ("model.source", {"huggingFace": {"revision": "main"}}, "huggingFace.repo"),
        ("model.name", "", "model.name"),
    ],
)
def test_invalid_values_name_their_field(path: str, value: Any, field: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(spec_with(path, value), "chat")
    assert field in err.value.field, str(err.value)
    assert str(err.value).startswith(err.value.field)


def test_gpus_must_cover_every_rank() -> None:
    spec = spec_with("engine.parallelism", {"tp": 4})
    spec["engine"] |= {"device": "cuda", "resources": {"gpus": 2}}
    with pytest.raises(SpecError, match="2 GPUs cannot hold 4 ranks") as err:
        parse_spec(spec, "chat")
    assert err.value.field == "spec.engine.resources.gpus"


def test_chunk_smaller_than_a_page_is_refused() -> None:
    spec = spec_with("engine.kvCache", {"pageSize": 64})
    spec["engine"]["scheduler"] = {"chunkedPrefillSize": 32}
    with pytest.raises(SpecError, match="pageSize"):
        parse_spec(spec, "chat")


@pytest.mark.parametrize("name", ["Chat", "1chat", "a" * 57, "chat_1"])
def test_names_that_cannot_name_the_children(name: str) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({"model": MODEL}, name)
    assert err.value.field == "metadata.name"


def test_missing_model_is_named() -> None:
    with pytest.raises(SpecError) as err:
        parse_spec({}, "chat")
    assert err.value.field == "spec.model"


def _pd(**changes: Any) -> dict[str, Any]:
    spec = copy.deepcopy(SMOLLM_PD)
    for path, value in changes.items():
        role, key = path.split("__")
        if value is None:
            spec[role].pop(key, None)
        else:
            spec[role][key] = value
    return spec


def test_pd_pools_parse_with_their_bootstrap_port() -> None:
    spec = parse_spec(SMOLLM_PD, "chat")
    assert spec.pd is not None and spec.pd.bootstrap_port == 8998
    assert (spec.pd.prefill.replicas, spec.pd.decode.replicas) == (1, 2)


@pytest.mark.parametrize(
    ("changes", "field", "words"),
    [
        ({"decode__kvCache": {"pageSize": 1}}, "spec.decode.kvCache", "prefill 16, decode 1"),
        ({"decode__extraArgs": ["--dtype", "bfloat16"]}, "spec.decode.extraArgs", "float32"),
        ({"decode__device": "cuda"}, "spec.decode.device", "prefill cpu, decode cuda"),
        ({"prefill__parallelism": {"dp": 2}}, "spec.prefill.parallelism", "dp = 1"),
        (
            {"decode__parallelism": {"tp": 2, "dp": 2, "dpAttention": True}},
            "spec.decode.parallelism",
            "no dpAttention",
        ),
        ({"prefill__bootstrapPort": 30000}, "spec.prefill.bootstrapPort", "free port"),
        ({"decode__bootstrapPort": 9000}, "spec.decode.bootstrapPort", "unknown field"),
        (
            {"prefill__extraArgs": ["--disaggregation-mode", "decode"]},
            "spec.prefill.extraArgs",
            "set by",
        ),
    ],
)
def test_pd_pairs_that_cannot_work_are_refused(
    changes: dict[str, Any], field: str, words: str
) -> None:
    with pytest.raises(SpecError) as err:
        parse_spec(_pd(**changes), "chat")
    assert err.value.field.startswith(field) and words in str(err.value), str(err.value)


def test_pd_needs_both_pools_and_no_engine_autoscaling() -> None:
    only = {k: v for k, v in SMOLLM_PD.items() if k != "decode"}
    with pytest.raises(SpecError, match="both pools or neither") as err:
        parse_spec(only, "chat")
    assert err.value.field == "spec.decode"
    scaled = {**SMOLLM_PD, "autoscaling": {"maxReplicas": 3, "targetPerReplica": 4}}
    with pytest.raises(SpecError, match="each pool's autoscaling") as err:
        parse_spec(scaled, "chat")
    with pytest.raises(SpecError) as err:
        parse_spec(SMOLLM_PD, "a" * 56)  # "-prefill" is one longer than "-engine"
    assert err.value.field == "metadata.name"


def test_pd_pools_autoscale_each_with_its_own_bounds() -> None:
    pd = parse_spec(SMOLLM_PD_AUTOSCALED, "chat").pd
    assert pd is not None
    prefill, decode = pd.scaling("prefill"), pd.scaling("decode")
    assert prefill is not None and (prefill.min_replicas, prefill.max_replicas) == (1, 3)
    assert decode is not None and (decode.metric, decode.target_per_replica) == (
        "kvTokenUsage",
        0.7,
    )
    bad = _pd(decode__autoscaling={"minReplicas": 5, "maxReplicas": 2, "targetPerReplica": 1})
    with pytest.raises(SpecError) as err:
        parse_spec(bad, "chat")
    assert err.value.field == "spec.decode.autoscaling.minReplicas"
