"""Spec validation: every bad value is refused with an error naming its field; defaults and
valid specs come through as frozen dataclasses."""

from __future__ import annotations

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
from tests.operator.cases import CASES, spec_with

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
