"""Sample InferenceService specs shared by the builder, spec and operator tests."""

from __future__ import annotations

import copy
from typing import Any

UID = "0c6b9f3e-5d0a-4d59-9a43-3f1b5a3a7e01"

SMOLLM_CPU: dict[str, Any] = {
    "model": {"name": "smollm2-135m", "source": {"builtin": "smollm2-135m"}},
    "engine": {
        "replicas": 2,
        "resources": {"cpu": 2, "memory": "4Gi"},
        "kvCache": {"pageSize": 16, "maxTotalTokens": 65536},
        "scheduler": {"policy": "lpm", "chunkedPrefillSize": 2048, "maxRunningRequests": 64},
    },
    "router": {"replicas": 2, "policy": "cache_aware"},
}

MOE_GPU: dict[str, Any] = {
    "model": {
        "name": "qwen3-30b-a3b",
        "source": {"huggingFace": {"repo": "Qwen/Qwen3-30B-A3B", "revision": "main"}},
    },
    "engine": {
        "replicas": 1,
        "device": "cuda",
        "resources": {"cpu": "16", "memory": "256Gi"},
        "parallelism": {"tp": 4, "dp": 4, "ep": 4, "dpAttention": True},
        "kvCache": {"pageSize": 64, "memoryFraction": 0.85},
        "extraArgs": ["--attention-backend", "triton"],
        "env": [{"name": "NCCL_DEBUG", "value": "WARN"}],
        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
        "tolerations": [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    },
    "router": {
        "policy": "cache_aware",
        "cacheAware": {"cacheThreshold": 0.5, "balanceAbsThreshold": 32, "balanceRelThreshold": 2},
    },
}

PVC_SUSPENDED: dict[str, Any] = {
    "model": {"name": "llama", "source": {"pvc": {"claimName": "models", "path": "llama-3-8b"}}},
    "engine": {"replicas": 3, "device": "cuda", "resources": {"gpus": 2}, "image": "my/engine:1"},
    "router": {"image": "my/router:1", "policy": "round_robin"},
    "suspend": True,
}

HOSTPATH_TP: dict[str, Any] = {
    "model": {"name": "tiny", "source": {"hostPath": "/data/tiny.gguf"}},
    "engine": {"parallelism": {"tp": 2, "dp": 2}},
}

SMOLLM_AUTOSCALED: dict[str, Any] = {
    "model": {"name": "smollm2-135m", "source": {"builtin": "smollm2-135m"}},
    "engine": {"replicas": 1, "resources": {"cpu": 2, "memory": "4Gi"}},
    "autoscaling": {
        "minReplicas": 2,
        "maxReplicas": 6,
        "metric": "requests",
        "targetPerReplica": 8,
        "scaleDownStabilizationSeconds": 600,
    },
}

# One Secret, two keys: the API key (default key name) and the router's admin key.
SMOLLM_KEYS: dict[str, Any] = {
    **SMOLLM_CPU,
    "apiKeySecretRef": {"name": "chat-keys"},
    "router": {**SMOLLM_CPU["router"], "adminKeySecretRef": {"name": "chat-keys", "key": "admin"}},
}

# Prefill/decode disaggregation: two pools of one model, pages and dtype agreeing.
SMOLLM_PD: dict[str, Any] = {
    "model": {"name": "smollm2-135m", "source": {"builtin": "smollm2-135m"}},
    "prefill": {
        "replicas": 1,
        "bootstrapPort": 8998,
        "resources": {"cpu": 2, "memory": "4Gi"},
        "kvCache": {"pageSize": 16},
        "extraArgs": ["--dtype", "float32"],
    },
    "decode": {
        "replicas": 2,
        "resources": {"cpu": 2, "memory": "4Gi"},
        "kvCache": {"pageSize": 16, "maxTotalTokens": 65536},
        "extraArgs": ["--dtype=float32"],
    },
    "router": {"policy": "cache_aware"},
}

# The PD pools, each with its own HPA (queued prompts for the prefill, KV use for the decode).
SMOLLM_PD_AUTOSCALED: dict[str, Any] = {
    **SMOLLM_PD,
    "prefill": {
        **SMOLLM_PD["prefill"],
        "autoscaling": {"maxReplicas": 3, "metric": "queuedRequests", "targetPerReplica": 4},
    },
    "decode": {
        **SMOLLM_PD["decode"],
        "autoscaling": {
            "minReplicas": 2,
            "maxReplicas": 8,
            "metric": "kvTokenUsage",
            "targetPerReplica": 0.7,
        },
    },
}

# HiCache: a host tier by size and a file storage tier on a shared claim.
SMOLLM_HICACHE: dict[str, Any] = {
    **SMOLLM_CPU,
    "engine": {
        **SMOLLM_CPU["engine"],
        "kvCache": {
            "pageSize": 16,
            "maxTotalTokens": 65536,
            "offload": {
                "hostSizeGB": 4,
                "writePolicy": "write_through_selective",
                "storage": {"file": {"sizeGB": 50, "claimName": "hicache-shared"}},
            },
        },
    },
}

# HiCache over a Mooncake store whose master the operator runs (chat-mooncake).
SMOLLM_MOONCAKE: dict[str, Any] = {
    **SMOLLM_CPU,
    "engine": {
        **SMOLLM_CPU["engine"],
        "resources": {"cpu": 2, "memory": "8Gi"},
        "kvCache": {
            "pageSize": 16,
            "maxTotalTokens": 65536,
            "offload": {
                "hostRatio": 2,
                "storage": {"mooncake": {"segmentSizeGB": 2}, "prefetchPolicy": "best_effort"},
            },
        },
    },
}

CASES = {
    "smollm-cpu": SMOLLM_CPU,
    "moe-gpu": MOE_GPU,
    "pvc-suspended": PVC_SUSPENDED,
    "hostpath-tp": HOSTPATH_TP,
    "smollm-autoscaled": SMOLLM_AUTOSCALED,
    "smollm-keys": SMOLLM_KEYS,
    "smollm-pd": SMOLLM_PD,
    "smollm-pd-autoscaled": SMOLLM_PD_AUTOSCALED,
    "smollm-hicache": SMOLLM_HICACHE,
    "smollm-mooncake": SMOLLM_MOONCAKE,
}


def spec_with(path: str, value: Any) -> dict[str, Any]:
    """SMOLLM_CPU with the field at dotted `path` (e.g. "router.policy") set to `value`."""
    spec = copy.deepcopy(SMOLLM_CPU)
    *parents, leaf = path.split(".")
    node = spec
    for key in parents:
        node = node.setdefault(key, {})
    node[leaf] = value
    return spec
