"""Builders: spec → manifests. Golden files pin the whole output (RADIXSERVE_REGEN_GOLDEN=1
rewrites them); the real oracles are Kubernetes' own schemas (kubernetes-validate --strict
for 1.31), the CRD's schema, and the engine's and router's own argument parsers."""

from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from radixserve.operator.builders import build_children, child_refs
from radixserve.operator.config import OperatorConfig
from radixserve.operator.engine_manifests import engine_args
from radixserve.operator.meta import Owner
from radixserve.operator.router_manifests import router_args
from radixserve.operator.spec import parse_spec
from tests.operator.cases import (
    CASES,
    HOSTPATH_TP,
    MOE_GPU,
    PVC_SUSPENDED,
    SMOLLM_CPU,
    SMOLLM_HICACHE,
    SMOLLM_MOONCAKE,
    SMOLLM_PD,
    UID,
    spec_with,
)

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CRD_PATH = ROOT / "manifests" / "crds" / "inferenceservices.radixserve.io.yaml"
K8S = "1.31.0"
OWNER = Owner(name="chat", namespace="llm", uid=UID)


def _children(case: dict[str, Any]) -> list[dict[str, Any]]:
    return build_children(OWNER, parse_spec(case, OWNER.name), OperatorConfig())


def _crd() -> dict[str, Any]:
    return yaml.safe_load(CRD_PATH.read_text())


@pytest.mark.parametrize("case", sorted(CASES))
def test_children_match_golden_files(case: str) -> None:
    text = yaml.safe_dump_all(_children(CASES[case]), sort_keys=True)
    path = GOLDEN / f"{case}.yaml"
    if os.environ.get("RADIXSERVE_REGEN_GOLDEN"):
        path.write_text(text)
    assert path.exists(), f"{path} missing: run with RADIXSERVE_REGEN_GOLDEN=1"
    assert text == path.read_text()


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_child_passes_kubernetes_strict_validation(case: str) -> None:
    children = _children(CASES[case])
    built = [(c["apiVersion"], c["kind"], c["metadata"]["name"]) for c in children]
    # every child in child_refs order
    assert built == [ref for ref in child_refs(OWNER.name) if ref in built]
    # only the HPAs are optional, either the engine pool or the prefill/decode pools, and the
    # Mooncake master (only for a Mooncake storage tier without a master of the user's)
    pools = {"chat-engine"} if "prefill" in CASES[case] else {"chat-prefill", "chat-decode"}
    pools.add("chat-mooncake")
    hpas = ("chat", "chat-prefill", "chat-decode")
    assert {ref for ref in child_refs(OWNER.name) if ref not in built} <= {
        *(("autoscaling/v2", "HorizontalPodAutoscaler", name) for name in hpas),
        *((api, kind, name) for api, kind, name in child_refs(OWNER.name) if name in pools),
    }
    for child in children:
        kubernetes_validate.validate(child, K8S, strict=True)
        assert child["metadata"]["ownerReferences"] == [OWNER.reference()]
        assert child["metadata"]["labels"]["radixserve.io/inferenceservice"] == "chat"


def test_crd_passes_kubernetes_strict_validation() -> None:
    crd = _crd()
    kubernetes_validate.validate(crd, K8S, strict=True)
    version = crd["spec"]["versions"][0]
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.engine.replicas"
    assert [c["name"] for c in version["additionalPrinterColumns"][:4]] == [
        "Ready",
        "Replicas",
        "URL",
        "Age",
    ]


@pytest.mark.parametrize("case", sorted(CASES))
def test_sample_specs_are_valid_against_the_crd_schema(case: str) -> None:
    schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    obj = {"apiVersion": "radixserve.io/v1alpha1", "kind": "InferenceService"}
    obj |= {"metadata": {"name": "chat"}, "spec": CASES[case]}
    # OpenAPI v3.0 schemas use draft-4 semantics (boolean exclusiveMinimum).
    jsonschema.Draft4Validator(schema).validate(obj)


def _apply_defaults(value: Any, schema: dict[str, Any]) -> Any:
    """Structural defaulting as the API server does it: missing keys get their default,
    then recurse (so a defaulted `{}` gets its members' defaults)."""
    if not isinstance(value, dict):
        return value
    out = dict(value)
    for key, prop in schema.get("properties", {}).items():
        if key not in out and "default" in prop:
            out[key] = prop["default"]
        if key in out:
            out[key] = _apply_defaults(out[key], prop)
    return out


def test_crd_defaults_equal_the_operators_defaults() -> None:
    spec_schema = _crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    minimal = {"model": SMOLLM_CPU["model"]}
    defaulted = _apply_defaults(minimal, spec_schema)
    assert defaulted["engine"]["parallelism"] == {"tp": 1, "dp": 1, "ep": 1, "dpAttention": False}
    assert parse_spec(defaulted, "chat") == parse_spec(minimal, "chat")


def _engine_namespace(args: list[str]) -> argparse.Namespace:
    from radixserve.engine.configs.cli_args import add_server_args

    parser = argparse.ArgumentParser()
    add_server_args(parser)
    assert args[0] == "serve"
    return parser.parse_args(args[1:])


def test_engine_args_parse_with_the_engines_own_parser() -> None:
    ns = _engine_namespace(engine_args(parse_spec(SMOLLM_CPU, "chat")))
    assert (ns.model_path, ns.served_model_name) == ("smollm2-135m", "smollm2-135m")
    assert (ns.host, ns.port, ns.kv_events_port) == ("0.0.0.0", 30000, 5557)
    assert (ns.page_size, ns.max_total_tokens, ns.schedule_policy) == (16, 65536, "lpm")
    assert (ns.chunked_prefill_size, ns.max_running_requests) == (2048, 64)
    assert (ns.tp_size, ns.dp_size, ns.ep_size, ns.enable_dp_attention) == (1, 1, 1, False)
    assert ns.device == "cpu"

    from radixserve.engine.configs.cli_args import server_args_from_namespace

    server_args_from_namespace(ns)  # the engine accepts the whole command line


def test_kv_offload_args_and_volume() -> None:
    spec = parse_spec(SMOLLM_HICACHE, "chat")
    args = engine_args(spec)
    ns = _engine_namespace(args)
    assert ns.enable_hierarchical_cache and ns.hicache_size == 4.0
    assert ns.hicache_write_policy == "write_through_selective"
    assert ns.hicache_storage_backend == "file"
    from radixserve.engine.configs.cli_args import server_args_from_namespace

    options = server_args_from_namespace(ns).hicache_storage_options()
    assert options["file_storage_path"] == "/hicache"
    assert options["file_storage_max_size_gb"] == 50.0
    (dep,) = [
        c
        for c in _children(SMOLLM_HICACHE)
        if c["kind"] == "Deployment" and "engine" in c["metadata"]["name"]
    ]
    pod = dep["spec"]["template"]["spec"]
    assert {"name": "hicache", "persistentVolumeClaim": {"claimName": "hicache-shared"}} in pod[
        "volumes"
    ]
    assert {"name": "hicache", "mountPath": "/hicache"} in pod["containers"][0]["volumeMounts"]


def test_a_mooncake_tier_gets_the_operators_master() -> None:
    """The engines' flags parse with the engine's own parser and point at the master's
    Service, whose selector and ports are the master pod's."""
    from radixserve.engine.configs.cli_args import server_args_from_namespace

    spec = parse_spec(SMOLLM_MOONCAKE, "chat")
    ns = _engine_namespace(engine_args(spec))
    assert ns.hicache_storage_backend == "mooncake"
    assert ns.hicache_storage_prefetch_policy == "best_effort"
    options = server_args_from_namespace(ns).hicache_storage_options()
    assert options["master_server_address"] == "chat-mooncake:50051"
    assert options["global_segment_size"] == 2 << 30
    assert options["local_hostname"] == ""  # the engine offers its segment at the pod's address
    children = {(c["kind"], c["metadata"]["name"]): c for c in _children(SMOLLM_MOONCAKE)}
    service, master = children["Service", "chat-mooncake"], children["Deployment", "chat-mooncake"]
    template = master["spec"]["template"]
    assert service["spec"]["selector"].items() <= template["metadata"]["labels"].items()
    (container,) = template["spec"]["containers"]
    assert container["command"] == ["mooncake_master"]
    named = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert {p["targetPort"]: p["port"] for p in service["spec"]["ports"]} == named
    assert "--rpc_port=50051" in container["args"]


def test_a_mooncake_tier_with_its_own_master_gets_none_from_the_operator() -> None:
    offload = {"storage": {"mooncake": {"masterAddress": "store.kv:50051"}}}
    spec = parse_spec(spec_with("engine.kvCache.offload", offload), "chat")
    ns = _engine_namespace(engine_args(spec))
    from radixserve.engine.configs.cli_args import server_args_from_namespace

    options = server_args_from_namespace(ns).hicache_storage_options()
    assert options["master_server_address"] == "store.kv:50051"
    assert options["global_segment_size"] == 1 << 30  # the spec's default
    kinds = {c["metadata"]["name"] for c in build_children(OWNER, spec, OperatorConfig())}
    assert "chat-mooncake" not in kinds


@pytest.mark.parametrize(
    ("storage", "name", "field"),
    [
        ({"file": {"sizeGB": 1}, "mooncake": {}}, "chat", "spec.engine.kvCache.offload.storage"),
        ({"prefetchPolicy": "timeout"}, "chat", "spec.engine.kvCache.offload.storage"),
        (
            {"mooncake": {"masterAddress": "no-port"}},
            "chat",
            "spec.engine.kvCache.offload.storage.mooncake.masterAddress",
        ),
        (
            {"mooncake": {}, "prefetchPolicy": "eager"},
            "chat",
            "spec.engine.kvCache.offload.storage.prefetchPolicy",
        ),
        ({"mooncake": {}}, "x" * 55, "metadata.name"),  # x-mooncake would pass 63 characters
    ],
)
def test_bad_storage_is_refused_naming_the_field(
    storage: dict[str, Any], name: str, field: str
) -> None:
    from radixserve.operator.schema import SpecError

    spec = spec_with("engine.kvCache.offload", {"storage": storage})
    with pytest.raises(SpecError, match=f"^{re.escape(field)}: "):
        parse_spec(spec, name)


def test_decode_pool_refuses_kv_offload() -> None:
    from radixserve.operator.schema import SpecError

    bad = {
        **SMOLLM_PD,
        "decode": {**SMOLLM_PD["decode"], "kvCache": {"pageSize": 16, "offload": {}}},
    }
    with pytest.raises(SpecError, match="^spec.decode.kvCache.offload: "):
        parse_spec(bad, "chat")


def test_parallel_engine_args_and_gpus() -> None:
    spec = parse_spec(MOE_GPU, "chat")
    ns = _engine_namespace(engine_args(spec))
    assert (ns.tp_size, ns.dp_size, ns.ep_size, ns.enable_dp_attention) == (4, 4, 4, True)
    assert (ns.device, ns.mem_fraction_static, ns.attention_backend) == ("cuda", 0.85, "triton")
    assert ns.model_path == "Qwen/Qwen3-30B-A3B"
    deployment = _children(MOE_GPU)[4]
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    # DP-attention ranks live inside the TP group: tp GPUs, not tp × dp.
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports["kv-events"] == 5557 and ports["kv-replay"] == 5558
    assert ports["kv-events-3"] == 5563 and ports["kv-replay-3"] == 5564

    plain_dp = parse_spec(HOSTPATH_TP, "chat")
    assert engine_args(plain_dp).count("--tp-size") == 1
    cuda = parse_spec(
        {**HOSTPATH_TP, "engine": {**HOSTPATH_TP["engine"], "device": "cuda"}}, "x"
    ).engine
    assert cuda.gpus == 4  # plain DP: dp copies of the TP group


def test_router_args_parse_with_the_routers_own_parser() -> None:
    from radixserve.router.config import add_router_args, config_from_namespace

    parser = argparse.ArgumentParser()
    add_router_args(parser)
    args = router_args(OWNER, parse_spec(MOE_GPU, "chat"))
    assert args[0] == "router"
    config = config_from_namespace(parser.parse_args(args[1:]))
    assert (config.host, config.port) == ("0.0.0.0", 8000)
    assert (config.k8s_service, config.k8s_namespace) == ("chat-engine", "llm")
    assert (config.policy, config.cache_threshold) == ("cache_aware", 0.5)
    assert (config.balance_abs_threshold, config.balance_rel_threshold) == (32, 2.0)


def test_suspend_scales_both_deployments_to_zero() -> None:
    children = {(c["kind"], c["metadata"]["name"]): c for c in _children(PVC_SUSPENDED)}
    assert children[("Deployment", "chat-engine")]["spec"]["replicas"] == 0
    assert children[("Deployment", "chat-router")]["spec"]["replicas"] == 0
    engine = children[("Deployment", "chat-engine")]["spec"]["template"]["spec"]
    assert engine["containers"][0]["image"] == "my/engine:1"
    [claim] = [v["persistentVolumeClaim"] for v in engine["volumes"] if v["name"] == "model"]
    assert claim == {"claimName": "models", "readOnly": True}
    assert "/models/llama-3-8b" in engine["containers"][0]["args"]


def test_pd_pools_args_parse_with_the_engines_and_routers_own_parsers() -> None:
    from radixserve.engine.configs.cli_args import server_args_from_namespace
    from radixserve.router.config import add_router_args, config_from_namespace

    spec = parse_spec(SMOLLM_PD, "chat")
    prefill = server_args_from_namespace(
        _engine_namespace(engine_args(spec.for_role("prefill"), "prefill"))
    )
    decode = server_args_from_namespace(
        _engine_namespace(engine_args(spec.for_role("decode"), "decode"))
    )
    assert (prefill.disaggregation_mode, prefill.disaggregation_bootstrap_port) == ("prefill", 8998)
    assert decode.disaggregation_mode == "decode"
    assert prefill.page_size == decode.page_size == 16 and prefill.dtype == decode.dtype
    parser = argparse.ArgumentParser()
    add_router_args(parser)
    config = config_from_namespace(parser.parse_args(router_args(OWNER, spec)[1:]))
    assert config.pd_disaggregation and config.k8s_service is None
    assert (config.k8s_prefill_service, config.k8s_decode_service) == (
        "chat-prefill",
        "chat-decode",
    )
    assert config.k8s_bootstrap_port == 8998
    children = {(c["kind"], c["metadata"]["name"]): c for c in _children(SMOLLM_PD)}
    service = children[("Service", "chat-prefill")]
    assert {"name": "bootstrap", "port": 8998, "targetPort": "bootstrap", "protocol": "TCP"} in (
        service["spec"]["ports"]
    )
    roles = {
        name: d["spec"]["selector"]["matchLabels"]["radixserve.io/role"]
        for (kind, name), d in children.items()
        if kind == "Deployment" and name != "chat-router"
    }
    assert roles == {"chat-prefill": "prefill", "chat-decode": "decode"}
    assert children[("Deployment", "chat-decode")]["spec"]["replicas"] == 2


def test_pd_pools_at_different_tp_sizes_render_for_the_engine() -> None:
    """Each pool renders its own TP size (prefill tp2, decode tp1): the engines re-slice the KV
    heads between them."""
    from radixserve.engine.configs.cli_args import server_args_from_namespace

    tp2 = {**SMOLLM_PD["prefill"], "parallelism": {"tp": 2}}
    spec = parse_spec({**SMOLLM_PD, "prefill": tp2}, "chat")
    prefill = server_args_from_namespace(
        _engine_namespace(engine_args(spec.for_role("prefill"), "prefill"))
    )
    decode = server_args_from_namespace(
        _engine_namespace(engine_args(spec.for_role("decode"), "decode"))
    )
    assert (prefill.tp_size, prefill.disaggregation_mode) == (2, "prefill")
    assert (decode.tp_size, decode.disaggregation_mode) == (1, "decode")


def test_pd_pools_hpas_scale_their_deployments() -> None:
    from tests.operator.cases import SMOLLM_PD_AUTOSCALED

    children = {(c["kind"], c["metadata"]["name"]): c for c in _children(SMOLLM_PD_AUTOSCALED)}
    for role, metric in (
        ("prefill", "radixserve_queued_requests"),
        ("decode", "radixserve_kv_token_usage"),
    ):
        hpa = children[("HorizontalPodAutoscaler", f"chat-{role}")]["spec"]
        assert hpa["scaleTargetRef"] == {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "name": f"chat-{role}",
        }
        assert hpa["metrics"][0]["pods"]["metric"]["name"] == metric
        assert "replicas" not in children[("Deployment", f"chat-{role}")]["spec"]  # the HPA's
    assert ("HorizontalPodAutoscaler", "chat") not in children
    suspended = _children({**SMOLLM_PD_AUTOSCALED, "suspend": True})
    assert not [c for c in suspended if c["kind"] == "HorizontalPodAutoscaler"]
    assert {
        c["spec"]["replicas"]
        for c in suspended
        if c["metadata"]["name"] in ("chat-prefill", "chat-decode") and c["kind"] == "Deployment"
    } == {0}
