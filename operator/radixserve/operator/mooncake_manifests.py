"""The Mooncake master an InferenceService's HiCache storage tier uses when
`kvCache.offload.storage.mooncake` names no `masterAddress`: a Deployment of one
`mooncake_master` (from the engine image, which ships Mooncake's wheel) and a Service the
engines reach it by.

The master only keeps metadata: which object lives in which client's segment. The memory is
the engines': each rank lends `segmentSizeGB` of its own (counted in the engine pod's
`resources.memory`) and the ranks move pages between each other over TCP. So the master is
small, holds nothing a restart loses for good (the engines re-register their segments; lost
objects are recomputed), and runs one replica with `Recreate`.
"""

from __future__ import annotations

from typing import Any

from radixserve.operator.kinds import DEPLOYMENT, SERVICE
from radixserve.operator.meta import (
    Owner,
    container_security_context,
    labels,
    object_meta,
    pod_security_context,
    selector,
)
from radixserve.operator.schema import InferenceServiceSpec, MooncakeStorage
from radixserve.operator.spec import MOONCAKE_SUFFIX

MOONCAKE = "mooncake"  # the component label of the master's pods
MOONCAKE_RPC_PORT = 50051  # mooncake_master's own default
MOONCAKE_METRICS_PORT = 9003
MASTER_REQUESTS = {"cpu": "100m", "memory": "256Mi"}


def mooncake_name(owner: str) -> str:
    return f"{owner}{MOONCAKE_SUFFIX}"


def owned_mooncake(spec: InferenceServiceSpec) -> MooncakeStorage | None:
    """The Mooncake storage tier whose master the operator runs, if any."""
    offload = spec.offload
    mooncake = None if offload is None else offload.mooncake
    if mooncake is None or mooncake.master_address is not None:
        return None
    return mooncake


def master_address(spec: InferenceServiceSpec, mooncake: MooncakeStorage) -> str:
    """host:port the engines give their store clients: the user's master, or the Service of
    the operator's (same namespace: the short name resolves)."""
    if mooncake.master_address is not None:
        return mooncake.master_address
    return f"{mooncake_name(spec.name)}:{MOONCAKE_RPC_PORT}"


def mooncake_master_deployment(owner: Owner, image: str) -> dict[str, Any]:
    container = {
        "name": MOONCAKE,
        "image": image,
        "command": ["mooncake_master"],
        "args": [
            f"--rpc_port={MOONCAKE_RPC_PORT}",
            f"--metrics_port={MOONCAKE_METRICS_PORT}",
            "--enable_http_metadata_server=false",  # the clients handshake peer to peer
        ],
        "ports": [
            {"name": "rpc", "containerPort": MOONCAKE_RPC_PORT, "protocol": "TCP"},
            {"name": "metrics", "containerPort": MOONCAKE_METRICS_PORT, "protocol": "TCP"},
        ],
        "resources": {"requests": dict(MASTER_REQUESTS)},
        "readinessProbe": {"tcpSocket": {"port": "rpc"}, "periodSeconds": 5},
        "livenessProbe": {"tcpSocket": {"port": "rpc"}, "periodSeconds": 15, "failureThreshold": 4},
        "volumeMounts": [{"name": "tmp", "mountPath": "/tmp"}],  # its logs
        "securityContext": container_security_context(),
    }
    pod = {
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "containers": [container],
        "volumes": [{"name": "tmp", "emptyDir": {}}],
    }
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": object_meta(owner, mooncake_name(owner.name), MOONCAKE),
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": selector(owner.name, MOONCAKE)},
            "strategy": {"type": "Recreate"},  # one master: never two owning one pool
            "template": {"metadata": {"labels": labels(owner.name, MOONCAKE)}, "spec": pod},
        },
    }


def mooncake_master_service(owner: Owner) -> dict[str, Any]:
    ports = [
        {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
        for name, port in (("rpc", MOONCAKE_RPC_PORT), ("metrics", MOONCAKE_METRICS_PORT))
    ]
    return {
        **SERVICE.type_meta(),
        "metadata": object_meta(owner, mooncake_name(owner.name), MOONCAKE),
        "spec": {"selector": selector(owner.name, MOONCAKE), "ports": ports},
    }
