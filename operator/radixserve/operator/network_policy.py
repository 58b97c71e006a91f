"""The engines' NetworkPolicy (operator setting `network_policy`): engine pods of X accept
traffic only from the router pods of X, on the engine's ports. The kubelet's probes come from
the pod's own node, which a NetworkPolicy cannot block, so they keep working. Policies are
additive: a Prometheus that scrapes the engines needs one more policy that allows it."""

from __future__ import annotations

from typing import Any

from radixserve.operator.config import ENGINE_HTTP_PORT
from radixserve.operator.engine_manifests import kv_event_ports
from radixserve.operator.kinds import NETWORK_POLICY
from radixserve.operator.meta import ENGINE, ROUTER, Owner, engine_name, object_meta, selector
from radixserve.operator.schema import InferenceServiceSpec


def engine_network_policy(owner: Owner, spec: InferenceServiceSpec) -> dict[str, Any]:
    """With prefill/decode pools, or a Mooncake storage tier, the engine pods of X also accept
    each other on any TCP port: the KV moves over Mooncake's and the control sockets'
    ephemeral ports, and the decode reaches the prefill's bootstrap port."""
    ports = [ENGINE_HTTP_PORT] + [p for _, p in kv_event_ports(spec.engine.parallelism.dp)]
    ingress: list[dict[str, Any]] = [
        {
            "from": [{"podSelector": {"matchLabels": selector(owner.name, ROUTER)}}],
            "ports": [{"protocol": "TCP", "port": port} for port in ports],
        }
    ]
    offload = spec.offload
    if spec.pd is not None or (offload is not None and offload.mooncake is not None):
        peers = {"podSelector": {"matchLabels": selector(owner.name, ENGINE)}}
        ingress.append({"from": [peers], "ports": [{"protocol": "TCP"}]})
    return {
        **NETWORK_POLICY.type_meta(),
        "metadata": object_meta(owner, engine_name(owner.name), ENGINE),
        "spec": {
            "podSelector": {"matchLabels": selector(owner.name, ENGINE)},
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }
