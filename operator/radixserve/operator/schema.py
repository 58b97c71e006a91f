"""The parsed InferenceService spec: frozen dataclasses the builders read.

`radixserve.operator.spec.parse_spec` makes them from the raw spec; nothing else does, so
every instance has passed validation.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any


class SpecError(ValueError):
    """A spec the operator cannot serve; `field` is the path of the offending field."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


@dataclass(frozen=True)
class SecretKeyRef:
    """One key of a Secret in the InferenceService's namespace; its value reaches the pods
    only as an env var from a secretKeyRef, never as an argument."""

    name: str
    key: str


@dataclass(frozen=True)
class BuiltinSource:
    alias: str


@dataclass(frozen=True)
class PvcSource:
    claim_name: str
    path: str


@dataclass(frozen=True)
class HostPathSource:
    path: str


@dataclass(frozen=True)
class HuggingFaceSource:
    repo: str
    revision: str | None


ModelSource = BuiltinSource | PvcSource | HostPathSource | HuggingFaceSource


@dataclass(frozen=True)
class ModelSpec:
    name: str
    source: ModelSource


@dataclass(frozen=True)
class Resources:
    cpu: str | None = None
    memory: str | None = None
    gpus: int | None = None


@dataclass(frozen=True)
class Parallelism:
    tp: int = 1
    dp: int = 1
    ep: int = 1
    dp_attention: bool = False

    @property
    def ranks(self) -> int:
        """Processes (and devices) per replica: DP-attention splits the TP group, plain DP
        runs dp copies of it."""
        return self.tp if self.dp_attention else self.tp * self.dp


@dataclass(frozen=True)
class FileStorage:
    """HiCache's file storage tier: a PVC shared by the replicas (ReadWriteMany), or an
    emptyDir per pod (`claim_name` None: each pod's own, not shared)."""

    size_gb: float
    claim_name: str | None = None


@dataclass(frozen=True)
class MooncakeStorage:
    """HiCache's storage tier in a Mooncake store: each engine rank lends `segment_size_gb` of
    its memory to the store, which a Mooncake master coordinates: the operator's own
    (`master_address` None: a Deployment and Service named `<name>-mooncake`), or a master
    the user runs."""

    segment_size_gb: float = 1.0
    master_address: str | None = None


@dataclass(frozen=True)
class KVOffload:
    """HiCache (--enable-hierarchical-cache): a host tier, and optionally a storage tier (one
    of `file` and `mooncake`)."""

    host_ratio: float | None = None
    host_size_gb: float | None = None
    write_policy: str | None = None
    file: FileStorage | None = None
    mooncake: MooncakeStorage | None = None
    prefetch_policy: str | None = None  # --hicache-storage-prefetch-policy


@dataclass(frozen=True)
class KVCache:
    page_size: int | None = None
    memory_fraction: float | None = None
    max_total_tokens: int | None = None
    offload: KVOffload | None = None


@dataclass(frozen=True)
class Scheduler:
    policy: str | None = None
    chunked_prefill_size: int | None = None
    max_running_requests: int | None = None


@dataclass(frozen=True)
class EngineSpec:
    replicas: int = 1
    image: str | None = None
    device: str = "cpu"
    resources: Resources = Resources()
    parallelism: Parallelism = Parallelism()
    kv_cache: KVCache = KVCache()
    scheduler: Scheduler = Scheduler()
    extra_args: tuple[str, ...] = ()
    env: tuple[Mapping[str, Any], ...] = ()
    node_selector: tuple[tuple[str, str], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()

    @property
    def gpus(self) -> int:
        """GPUs per pod: the explicit count, else one per rank on cuda, else none."""
        if self.device != "cuda":
            return 0
        return self.resources.gpus or self.parallelism.ranks


@dataclass(frozen=True)
class RouterSpec:
    replicas: int = 1
    image: str | None = None
    policy: str = "cache_aware"
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    admin_key: SecretKeyRef | None = None  # opens the router's admin API (/workers)


@dataclass(frozen=True)
class Autoscaling:
    """`spec.autoscaling`: an HPA on the InferenceService's /scale subresource; or a PD pool's
    (`spec.prefill.autoscaling`, `spec.decode.autoscaling`): an HPA on the pool's Deployment.

    `metric` is a key of `radixserve.operator.autoscaling.METRICS`; `target_per_replica` is the
    average value per engine pod the HPA aims at (a fraction for kvTokenUsage).
    """

    max_replicas: int
    target_per_replica: float
    min_replicas: int = 1
    metric: str = "requests"
    scale_down_stabilization_s: int = 300

    def clamp(self, replicas: int) -> int:
        """`replicas` kept within [min_replicas, max_replicas]."""
        return max(self.min_replicas, min(self.max_replicas, replicas))


PREFILL = "prefill"
DECODE = "decode"
ROLES = (PREFILL, DECODE)


@dataclass(frozen=True)
class PDSpec:
    """`spec.prefill` and `spec.decode`: prefill/decode disaggregation, two engine pools of one
    model whose KV pages must agree (docs/disaggregation.md)."""

    prefill: EngineSpec
    decode: EngineSpec
    bootstrap_port: int = 8998  # spec.prefill.bootstrapPort
    prefill_autoscaling: Autoscaling | None = None  # spec.prefill.autoscaling
    decode_autoscaling: Autoscaling | None = None

    def pool(self, role: str) -> EngineSpec:
        return self.prefill if role == PREFILL else self.decode

    def scaling(self, role: str) -> Autoscaling | None:
        """The pool's autoscaling: an HPA on its Deployment, which then owns its replicas."""
        return self.prefill_autoscaling if role == PREFILL else self.decode_autoscaling


@dataclass(frozen=True)
class InferenceServiceSpec:
    model: ModelSpec
    engine: EngineSpec = EngineSpec()
    router: RouterSpec = RouterSpec()
    autoscaling: Autoscaling | None = None
    suspend: bool = False
    api_key: SecretKeyRef | None = None  # clients → router → engines, one key
    pd: PDSpec | None = None  # prefill/decode pools instead of spec.engine
    name: str = ""  # the InferenceService's (children's names derive from it)

    @property
    def offload(self) -> KVOffload | None:
        """kvCache.offload of the pool that caches prefixes: spec.engine's, or spec.prefill's
        (a decode pool has none)."""
        engine = self.engine if self.pd is None else self.pd.pool(PREFILL)
        return engine.kv_cache.offload

    def for_role(self, role: str) -> InferenceServiceSpec:
        """This spec with the role's pool as its engine (what the engine builders read)."""
        assert self.pd is not None
        return replace(self, engine=self.pd.pool(role))

    @property
    def engine_replicas(self) -> int:
        """What the engine Deployment runs: 0 when suspended, else spec.engine.replicas (the
        /scale subresource, which the HPA writes) kept within the autoscaling bounds."""
        if self.suspend:
            return 0
        if self.autoscaling is not None:
            return self.autoscaling.clamp(self.engine.replicas)
        return self.engine.replicas
