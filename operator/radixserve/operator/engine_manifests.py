"""Engine children: the Deployment of engine pods and the headless Service the router watches.

Pure functions of the parsed spec. Every engine flag the spec implies is derived here, so the
pod's command line is the one place to read what an InferenceService runs.
"""

from __future__ import annotations

import json
import math
from typing import Any

from radixserve.operator.config import ENGINE_HTTP_PORT, KV_EVENTS_PORT
from radixserve.operator.kinds import DEPLOYMENT, SERVICE
from radixserve.operator.meta import (
    ENGINE,
    HOME,
    Owner,
    container_security_context,
    object_meta,
    pod_security_context,
    pool_labels,
    pool_name,
    pool_selector,
    secret_env,
)
from radixserve.operator.mooncake_manifests import master_address
from radixserve.operator.schema import (
    PREFILL,
    BuiltinSource,
    EngineSpec,
    FileStorage,
    HostPathSource,
    HuggingFaceSource,
    InferenceServiceSpec,
    KVOffload,
    PvcSource,
)
from radixserve.operator.spec import API_KEY_ENV, quantity_value

MODELS_DIR = "/models"
HICACHE_DIR = "/hicache"  # the file storage tier's mount
HF_HOME = "/cache/huggingface"
# The root filesystem is read-only: what the engine writes goes to emptyDirs. /tmp holds the
# ipc:// sockets and torch's compile caches; ~/.cache the default HF cache and Triton's.
SCRATCH = (("tmp", "/tmp"), ("cache", f"{HOME}/.cache"))
TRITON_CACHE_DIR = f"{HOME}/.cache/triton"
GPU_RESOURCE = "nvidia.com/gpu"
# Model loading (or a download) can take many minutes: the startup probe allows 30 of them
# before liveness may restart the pod.
STARTUP_PERIOD_S = 10
STARTUP_FAILURES = 180


def model_path(spec: InferenceServiceSpec) -> str:
    """What the engine gets as --model-path for each kind of source."""
    source = spec.model.source
    if isinstance(source, BuiltinSource):
        return source.alias
    if isinstance(source, PvcSource):
        return f"{MODELS_DIR}/{source.path}".rstrip("/")
    if isinstance(source, HostPathSource):
        return source.path  # mounted at the same path inside the pod
    return source.repo


def kv_event_ports(dp: int) -> list[tuple[str, int]]:
    """(name, port) of the KV-event ports declared for `dp` DP ranks: rank r's events on
    5557 + 2r and its replay on the next port (the engine publisher's `port_for_rank` rule),
    named `kv-events` / `kv-replay` for rank 0 and `kv-events-<r>` / `kv-replay-<r>` after it:
    the router's Kubernetes discovery follows them by those names."""
    ports: list[tuple[str, int]] = []
    for rank in range(dp):
        suffix = f"-{rank}" if rank else ""
        ports.append((f"kv-events{suffix}", KV_EVENTS_PORT + 2 * rank))
        ports.append((f"kv-replay{suffix}", KV_EVENTS_PORT + 2 * rank + 1))
    return ports


def engine_args(spec: InferenceServiceSpec, role: str | None = None) -> list[str]:
    """The pod's command line; `role`: a prefill / decode pool's (with `spec.for_role`)."""
    e = spec.engine
    args = ["serve", "--model-path", model_path(spec), "--served-model-name", spec.model.name]
    args += ["--host", "0.0.0.0", "--port", str(ENGINE_HTTP_PORT)]
    args += ["--kv-events-port", str(KV_EVENTS_PORT)]
    source = spec.model.source
    if isinstance(source, HuggingFaceSource) and source.revision:
        args += ["--revision", source.revision]
    if e.device != "cpu":
        args += ["--device", e.device]
    optional = [
        ("--page-size", e.kv_cache.page_size),
        ("--mem-fraction-static", e.kv_cache.memory_fraction),
        ("--max-total-tokens", e.kv_cache.max_total_tokens),
        ("--schedule-policy", e.scheduler.policy),
        ("--chunked-prefill-size", e.scheduler.chunked_prefill_size),
        ("--max-running-requests", e.scheduler.max_running_requests),
    ]
    args += [part for flag, value in optional if value is not None for part in (flag, str(value))]
    p = e.parallelism
    for flag, value in (("--tp-size", p.tp), ("--dp-size", p.dp), ("--ep-size", p.ep)):
        if value != 1:
            args += [flag, str(value)]
    if p.dp_attention:
        args.append("--enable-dp-attention")
    args += _offload_args(spec, e.kv_cache.offload)
    if role is not None:
        args += ["--disaggregation-mode", role]
    if role == PREFILL and spec.pd is not None:
        args += ["--disaggregation-bootstrap-port", str(spec.pd.bootstrap_port)]
    return args + list(e.extra_args)


def _offload_args(spec: InferenceServiceSpec, offload: KVOffload | None) -> list[str]:
    """HiCache's flags: the host tier, and the storage tier (files on their volume, or a
    Mooncake store whose master is the operator's or the user's)."""
    if offload is None:
        return []
    args = ["--enable-hierarchical-cache"]
    if offload.host_ratio is not None:
        args += ["--hicache-ratio", str(offload.host_ratio)]
    if offload.host_size_gb is not None:
        args += ["--hicache-size", str(offload.host_size_gb)]
    if offload.write_policy is not None:
        args += ["--hicache-write-policy", offload.write_policy]
    if offload.file is not None:
        config = {
            "file_storage_path": HICACHE_DIR,
            "file_storage_max_size_gb": offload.file.size_gb,
        }
        args += ["--hicache-storage-backend", "file"]
        args += ["--hicache-storage-backend-extra-config", json.dumps(config)]
    if offload.mooncake is not None:
        # local_hostname left out: the engine offers its segment at the pod's own address
        config = {
            "master_server_address": master_address(spec, offload.mooncake),
            "global_segment_size": int(offload.mooncake.segment_size_gb * (1 << 30)),
        }
        args += ["--hicache-storage-backend", "mooncake"]
        args += ["--hicache-storage-backend-extra-config", json.dumps(config)]
    if offload.prefetch_policy is not None:
        args += ["--hicache-storage-prefetch-policy", offload.prefetch_policy]
    return args


def _pool_ports(spec: InferenceServiceSpec, role: str | None) -> list[tuple[str, int]]:
    """(name, port) the pool's pods serve: HTTP, KV events, and a prefill's bootstrap server
    (named `bootstrap`: the router's PD discovery and the decode pods reach it by that)."""
    ports = [("http", ENGINE_HTTP_PORT), *kv_event_ports(spec.engine.parallelism.dp)]
    if role == PREFILL and spec.pd is not None:
        ports.append(("bootstrap", spec.pd.bootstrap_port))
    return ports


def _resources(e: EngineSpec) -> dict[str, Any]:
    requests: dict[str, str] = {}
    limits: dict[str, str] = {}
    if e.resources.cpu is not None:
        requests["cpu"] = e.resources.cpu
    if e.resources.memory is not None:
        # Limit = request: the KV pool is sized from memory, so the pod must own all of it.
        requests["memory"] = limits["memory"] = e.resources.memory
    if e.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = str(e.gpus)
    out: dict[str, Any] = {}
    if requests:
        out["requests"] = requests
    if limits:
        out["limits"] = limits
    return out


def _volumes(spec: InferenceServiceSpec) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(pod volumes, container mounts). /dev/shm is memory-backed: the engine's processes
    exchange tensors through it and a container's default 64 MiB is too small."""
    volumes: list[dict[str, Any]] = [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
    mounts: list[dict[str, Any]] = [{"name": "dshm", "mountPath": "/dev/shm"}]
    for name, path in SCRATCH:
        volumes.append({"name": name, "emptyDir": {}})
        mounts.append({"name": name, "mountPath": path})
    source = spec.model.source
    if isinstance(source, PvcSource):
        claim = {"claimName": source.claim_name, "readOnly": True}
        volumes.append({"name": "model", "persistentVolumeClaim": claim})
        mounts.append({"name": "model", "mountPath": MODELS_DIR, "readOnly": True})
    elif isinstance(source, HostPathSource):
        volumes.append({"name": "model", "hostPath": {"path": source.path}})
        mounts.append({"name": "model", "mountPath": source.path, "readOnly": True})
    elif isinstance(source, HuggingFaceSource):
        volumes.append({"name": "hf-cache", "emptyDir": {}})
        mounts.append({"name": "hf-cache", "mountPath": HF_HOME})
    offload = spec.engine.kv_cache.offload
    if offload is not None and offload.file is not None:
        volumes.append(_hicache_volume(offload.file))
        mounts.append({"name": "hicache", "mountPath": HICACHE_DIR})
    return volumes, mounts


def _hicache_volume(file: FileStorage) -> dict[str, Any]:
    """The storage tier's folder: a shared claim, or an emptyDir sized with 10 % headroom over
    the capacity the engine keeps (it deletes down to 90 % when it crosses it)."""
    if file.claim_name is not None:
        return {"name": "hicache", "persistentVolumeClaim": {"claimName": file.claim_name}}
    limit_mi = math.ceil(file.size_gb * 1.1 * 1024)
    return {"name": "hicache", "emptyDir": {"sizeLimit": f"{limit_mi}Mi"}}


def cpu_threads(e: EngineSpec) -> int | None:
    """Torch threads per engine process of a CPU pod: its CPU request's whole CPUs, shared by
    its ranks. The request sets no quota, so without this every rank would start one thread
    per node core, and replicas sharing a node would spin against each other at every
    barrier (docs/benchmarks.md, "Cores shared with another process")."""
    if e.device != "cpu" or e.resources.cpu is None:
        return None
    return max(1, math.floor(quantity_value(e.resources.cpu)) // e.parallelism.ranks)


def _env(spec: InferenceServiceSpec) -> list[dict[str, Any]]:
    ours: list[dict[str, Any]] = [{"name": "TRITON_CACHE_DIR", "value": TRITON_CACHE_DIR}]
    threads = cpu_threads(spec.engine)
    if threads is not None:
        ours.append({"name": "OMP_NUM_THREADS", "value": str(threads)})
    source = spec.model.source
    if isinstance(source, HuggingFaceSource):
        ours.append({"name": "HF_HOME", "value": HF_HOME})  # the download goes to the emptyDir
    if spec.api_key is not None:
        ours.append(secret_env(API_KEY_ENV, spec.api_key))  # the spec parser refuses a user's
    user = [dict(item) for item in spec.engine.env]
    overridden = {item["name"] for item in user}
    return [item for item in ours if item["name"] not in overridden] + user


def _probe(path: str, period: int, failures: int, timeout: int = 5) -> dict[str, Any]:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "timeoutSeconds": timeout,
        "failureThreshold": failures,
    }


def engine_container(
    spec: InferenceServiceSpec, image: str, role: str | None = None
) -> dict[str, Any]:
    _, mounts = _volumes(spec)
    ports = [
        {"name": name, "containerPort": port, "protocol": "TCP"}
        for name, port in _pool_ports(spec, role)
    ]
    container: dict[str, Any] = {
        "name": ENGINE,
        "image": spec.engine.image or image,
        "command": ["radixserve"],
        "args": engine_args(spec, role),
        "ports": ports,
        "env": _env(spec),
        "resources": _resources(spec.engine),
        "startupProbe": _probe("/health", STARTUP_PERIOD_S, STARTUP_FAILURES),
        "readinessProbe": _probe("/health", 5, 3),
        "livenessProbe": _probe("/health", 15, 4, timeout=10),
        # Give the router time to drop this pod from its EndpointSlice view before SIGTERM.
        "lifecycle": {"preStop": {"sleep": {"seconds": 10}}},
        "volumeMounts": mounts,
        "securityContext": container_security_context(),
    }
    return container


def engine_deployment(
    owner: Owner, spec: InferenceServiceSpec, image: str, role: str | None = None
) -> dict[str, Any]:
    """The engine pods, or (`role`, with `spec.for_role(role)`) one PD pool's."""
    e = spec.engine
    volumes, _ = _volumes(spec)
    pod: dict[str, Any] = {
        "automountServiceAccountToken": False,  # engines never call the API
        "enableServiceLinks": False,
        "securityContext": pod_security_context(),
        "terminationGracePeriodSeconds": 60,
        "containers": [engine_container(spec, image, role)],
        "volumes": volumes,
    }
    if e.node_selector:
        pod["nodeSelector"] = dict(e.node_selector)
    if e.tolerations:
        pod["tolerations"] = [dict(t) for t in e.tolerations]
    # GPUs are scarce: replace pods one at a time instead of surging onto extra devices.
    surge = 0 if e.gpus else 1
    rolling = {"maxSurge": surge, "maxUnavailable": 1 - surge}
    # A PD pool with its own HPA: the HPA sets the Deployment's replicas, the operator does not
    scaled = spec.pd is not None and role is not None and spec.pd.scaling(role) is not None
    replicas = {} if scaled and not spec.suspend else {"replicas": spec.engine_replicas}
    return {
        **DEPLOYMENT.type_meta(),
        "metadata": _pool_meta(owner, role),
        "spec": {
            **replicas,
            "selector": {"matchLabels": pool_selector(owner.name, role)},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": rolling},
            "template": {
                "metadata": {
                    "labels": pool_labels(owner.name, role),
                    "annotations": {"kubectl.kubernetes.io/default-container": ENGINE},
                },
                "spec": pod,
            },
        },
    }


def engine_service(
    owner: Owner, spec: InferenceServiceSpec, role: str | None = None
) -> dict[str, Any]:
    """Headless: the router needs every pod's address (EndpointSlices), not a virtual IP."""
    ports = [
        {"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
        for name, port in _pool_ports(spec, role)
    ]
    return {
        **SERVICE.type_meta(),
        "metadata": _pool_meta(owner, role),
        "spec": {
            "clusterIP": "None",
            "selector": pool_selector(owner.name, role),
            "ports": ports,
        },
    }


def _pool_meta(owner: Owner, role: str | None) -> dict[str, Any]:
    meta = object_meta(owner, pool_name(owner.name, role), ENGINE)
    meta["labels"] = pool_labels(owner.name, role)
    return meta
