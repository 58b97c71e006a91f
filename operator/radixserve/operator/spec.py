"""InferenceService spec → frozen dataclasses, with errors that name the field.

The CRD schema already applies defaults and rejects most bad values, but the operator does
not trust it: the CRD may be older than the operator, CEL rules may be off, and some rules
(flags in `extraArgs` that the operator owns) are not in the schema at all. So every rule is
checked here again, and the defaults are the CRD's.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from types import MappingProxyType
from typing import Any

from radixserve.operator.flag_choices import (
    ENGINE_POLICIES,
    HICACHE_PREFETCH_POLICIES,
    HICACHE_WRITE_POLICIES,
    ROUTER_POLICIES,
)
from radixserve.operator.schema import (
    DECODE,
    PREFILL,
    ROLES,
    Autoscaling,
    BuiltinSource,
    EngineSpec,
    FileStorage,
    HostPathSource,
    HuggingFaceSource,
    InferenceServiceSpec,
    KVCache,
    KVOffload,
    ModelSource,
    ModelSpec,
    MooncakeStorage,
    Parallelism,
    PDSpec,
    PvcSource,
    Resources,
    RouterSpec,
    Scheduler,
    SecretKeyRef,
    SpecError,
)

DEVICES = ("cpu", "cuda")
# Keys of radixserve.operator.autoscaling.METRICS (kept here: spec parsing imports no builder).
AUTOSCALING_METRICS = ("requests", "queuedRequests", "kvTokenUsage")
MAX_STABILIZATION_S = 3600  # the HPA API's own limit for stabilizationWindowSeconds
MAX_NAME_LENGTH = 56  # children add "-engine" / "-router"; Service names are ≤ 63
RESERVED_PORTS = (30000, 5557, 5558, 8000)  # the engine's HTTP and KV-event ports, the router's
_DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_SECRET_KEY = re.compile(r"^[-._a-zA-Z0-9]+$")
HOST_PORT = re.compile(r"^[-.a-zA-Z0-9]+:[0-9]{1,5}$")
MOONCAKE_SUFFIX = "-mooncake"  # the operator's Mooncake master: Deployment and Service
# Env vars the operator fills from secretKeyRefs (spec.engine.env may not set them).
API_KEY_ENV = "RADIXSERVE_API_KEY"
_QUANTITY = re.compile(
    r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
    r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$"
)
_QUANTITY_SCALE = MappingProxyType(
    {"n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
     "E": 1e18, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
)  # fmt: skip


def quantity_value(text: str) -> float:
    """The number a Kubernetes quantity stands for: "500m" → 0.5, "2Gi" → 2**31, "1e3" → 1000
    (`text` already matched _QUANTITY)."""
    for suffix in sorted(_QUANTITY_SCALE, key=len, reverse=True):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * _QUANTITY_SCALE[suffix]
    return float(text)


# Flags the operator derives from the spec: set twice, the engine would silently take the last.
MANAGED_ENGINE_FLAGS = MappingProxyType(
    {
        "--model-path": "spec.model.source",
        "--served-model-name": "spec.model.name",
        "--revision": "spec.model.source.huggingFace.revision",
        "--host": "the operator (0.0.0.0)",
        "--port": "the operator (30000)",
        "--kv-events-port": "the operator (5557)",
        "--device": "spec.engine.device",
        "--tp-size": "spec.engine.parallelism.tp",
        "--dp-size": "spec.engine.parallelism.dp",
        "--ep-size": "spec.engine.parallelism.ep",
        "--enable-dp-attention": "spec.engine.parallelism.dpAttention",
        "--page-size": "spec.engine.kvCache.pageSize",
        "--mem-fraction-static": "spec.engine.kvCache.memoryFraction",
        "--max-total-tokens": "spec.engine.kvCache.maxTotalTokens",
        "--enable-hierarchical-cache": "spec.engine.kvCache.offload",
        "--hicache-ratio": "spec.engine.kvCache.offload.hostRatio",
        "--hicache-size": "spec.engine.kvCache.offload.hostSizeGB",
        "--hicache-write-policy": "spec.engine.kvCache.offload.writePolicy",
        "--hicache-storage-backend": "spec.engine.kvCache.offload.storage",
        "--hicache-storage-backend-extra-config": "spec.engine.kvCache.offload.storage",
        "--schedule-policy": "spec.engine.scheduler.policy",
        "--chunked-prefill-size": "spec.engine.scheduler.chunkedPrefillSize",
        "--max-running-requests": "spec.engine.scheduler.maxRunningRequests",
        "--api-key": "spec.apiKeySecretRef (a Secret, so the key is never in the pod's args)",
        "--disaggregation-mode": "spec.prefill / spec.decode",
        "--disaggregation-bootstrap-port": "spec.prefill.bootstrapPort",
    }
)
_TOLERATION_KEYS = frozenset({"key", "operator", "value", "effect", "tolerationSeconds"})


class _Reader:
    """One object of the spec: typed getters that name the field, and an unknown-key check."""

    def __init__(self, data: Any, path: str) -> None:
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise SpecError(path, f"must be an object, got {type(data).__name__}")
        self.data: Mapping[str, Any] = data
        self.path = path

    def at(self, key: str) -> str:
        return f"{self.path}.{key}"

    def child(self, key: str, required: bool = False) -> _Reader:
        if required and self.data.get(key) is None:
            raise SpecError(self.at(key), "is required")
        return _Reader(self.data.get(key), self.at(key))

    def integer(self, key: str, default: int | None, minimum: int | None = None) -> int | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(self.at(key), f"must be an integer, got {value!r}")
        if minimum is not None and value < minimum:
            raise SpecError(self.at(key), f"must be ≥ {minimum}, got {value}")
        return value

    def number(self, key: str, default: float | None) -> float | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise SpecError(self.at(key), f"must be a number, got {value!r}")
        return float(value)

    def string(self, key: str, default: str | None, choices: tuple[str, ...] = ()) -> str | None:
        value = self.data.get(key, default)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise SpecError(self.at(key), f"must be a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise SpecError(self.at(key), f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def boolean(self, key: str, default: bool) -> bool:
        value = self.data.get(key, default)
        if not isinstance(value, bool):
            raise SpecError(self.at(key), f"must be true or false, got {value!r}")
        return value

    def items(self, key: str) -> list[Any]:
        value = self.data.get(key)
        if value is None:
            return []
        if not isinstance(value, list):
            raise SpecError(self.at(key), f"must be a list, got {type(value).__name__}")
        return value

    def only(self, *known: str) -> None:
        unknown = sorted(set(self.data) - set(known))
        if unknown:
            raise SpecError(self.at(unknown[0]), f"unknown field (known: {', '.join(known)})")


def validate_name(name: str) -> None:
    if len(name) > MAX_NAME_LENGTH:
        raise SpecError("metadata.name", f"must be at most {MAX_NAME_LENGTH} characters")
    if not _DNS_LABEL.match(name):
        raise SpecError("metadata.name", "must be a DNS label: a-z, 0-9 and '-', from a letter")


def parse_spec(spec: Mapping[str, Any] | None, name: str) -> InferenceServiceSpec:
    """Validate and normalise one InferenceService spec (with the CRD's defaults)."""
    validate_name(name)
    r = _Reader(spec, "spec")
    r.only(
        "model", "engine", "router", "autoscaling", "suspend", "apiKeySecretRef", "prefill",
        "decode",
    )  # fmt: skip
    pd = _pd(r, name)
    if pd is not None and r.data.get("autoscaling") is not None:
        raise SpecError(
            "spec.autoscaling",
            "scales spec.engine; with spec.prefill / spec.decode use each pool's autoscaling",
        )
    parsed = InferenceServiceSpec(
        model=_model(r.child("model", required=True)),
        engine=_engine(r.child("engine")),
        router=_router(r.child("router")),
        autoscaling=(
            _autoscaling(r.child("autoscaling")) if r.data.get("autoscaling") is not None else None
        ),
        suspend=r.boolean("suspend", False),
        api_key=_secret_ref(r, "apiKeySecretRef", "api-key"),
        pd=pd,
        name=name,
    )
    _check_mooncake_name(parsed, name)
    return parsed


def _check_mooncake_name(spec: InferenceServiceSpec, name: str) -> None:
    offload = spec.offload
    mooncake = None if offload is None else offload.mooncake
    if mooncake is None or mooncake.master_address is not None:
        return
    limit = 63 - len(MOONCAKE_SUFFIX)
    if len(name) > limit:
        raise SpecError(
            "metadata.name",
            f"must be at most {limit} characters with an operator-run Mooncake master",
        )


def _pd(r: _Reader, name: str) -> PDSpec | None:
    """`spec.prefill` + `spec.decode`: both or neither, and a pair whose KV pages agree."""
    has = [role for role in ROLES if r.data.get(role) is not None]
    if not has:
        return None
    if len(has) == 1:
        missing = DECODE if has[0] == PREFILL else PREFILL
        raise SpecError(r.at(missing), f"is required with spec.{has[0]} (both pools or neither)")
    if len(name) > MAX_NAME_LENGTH - 1:  # children add "-prefill", one more than "-engine"
        raise SpecError("metadata.name", f"must be at most {MAX_NAME_LENGTH - 1} characters")
    prefill_r = r.child(PREFILL)
    port = prefill_r.integer("bootstrapPort", 8998, 1)
    if port is None or port > 65535 or port in RESERVED_PORTS:
        raise SpecError(prefill_r.at("bootstrapPort"), f"must be a free port, got {port}")
    pools = {
        PREFILL: _engine(prefill_r, extra=("bootstrapPort", "autoscaling")),
        DECODE: _engine(r.child(DECODE), extra=("autoscaling",)),
    }
    for role, pool in pools.items():
        _check_pd_pool(pool, r.at(role))
    _check_pair(pools[PREFILL], pools[DECODE])
    scaling = {
        role: _autoscaling(r.child(role).child("autoscaling"))
        if r.child(role).data.get("autoscaling") is not None
        else None
        for role in ROLES
    }
    return PDSpec(
        prefill=pools[PREFILL],
        decode=pools[DECODE],
        bootstrap_port=port,
        prefill_autoscaling=scaling[PREFILL],
        decode_autoscaling=scaling[DECODE],
    )


def _check_pd_pool(pool: EngineSpec, path: str) -> None:
    p = pool.parallelism
    if (p.dp, p.dp_attention) != (1, False):  # a pool's TP ranks share its rooms; DP's would not
        raise SpecError(
            f"{path}.parallelism",
            "prefill/decode pools run with dp = 1 and no dpAttention (tp and ep may be > 1)",
        )


def _dtype(pool: EngineSpec) -> str:
    """The pool's --dtype from extraArgs (the engine's default, auto, when absent)."""
    args = list(pool.extra_args)
    for i, arg in enumerate(args):
        if arg.startswith("--dtype="):
            return arg.split("=", 1)[1]
        if arg == "--dtype" and i + 1 < len(args):
            return args[i + 1]
    return "auto"


def _check_pair(prefill: EngineSpec, decode: EngineSpec) -> None:
    """What must agree for the prefill's KV pages to be the decode's: the page size, the KV
    dtype (--dtype, which `auto` resolves per device, so the device too). The model is one
    spec.model for both. A decode pool keeps no radix cache, so no HiCache either."""
    if decode.kv_cache.offload is not None:
        raise SpecError(
            "spec.decode.kvCache.offload",
            "a decode pool keeps no prefix cache to offload; set it on spec.prefill",
        )
    pairs = (
        ("kvCache.pageSize", prefill.kv_cache.page_size or 1, decode.kv_cache.page_size or 1),
        ("device", prefill.device, decode.device),
        ("extraArgs --dtype", _dtype(prefill), _dtype(decode)),
    )
    for field, p, d in pairs:
        if p != d:
            raise SpecError(
                f"spec.decode.{field.split()[0]}",
                f"must equal spec.prefill's ({field}: prefill {p}, decode {d}): the decode "
                "takes the prefill's KV pages as they are",
            )


def _secret_ref(parent: _Reader, field: str, default_key: str) -> SecretKeyRef | None:
    """`{name, key}` of a Secret in the same namespace (key defaults to `default_key`)."""
    if parent.data.get(field) is None:
        return None
    r = parent.child(field)
    r.only("name", "key")
    name = r.string("name", None)
    if name is None or len(name) > 253 or not _DNS_SUBDOMAIN.match(name):
        raise SpecError(r.at("name"), f"must be a Secret name (a DNS subdomain), got {name!r}")
    key = r.string("key", default_key) or default_key
    if len(key) > 253 or not _SECRET_KEY.match(key):
        raise SpecError(r.at("key"), f"must be a Secret data key ([-._a-zA-Z0-9]+), got {key!r}")
    return SecretKeyRef(name=name, key=key)


def _model(r: _Reader) -> ModelSpec:
    r.only("name", "source")
    name = r.string("name", None)
    if name is None:
        raise SpecError(r.at("name"), "is required")
    return ModelSpec(name=name, source=_source(r.child("source", required=True)))


def _source(r: _Reader) -> ModelSource:
    kinds = ("builtin", "pvc", "hostPath", "huggingFace")
    r.only(*kinds)
    chosen = [k for k in kinds if r.data.get(k) is not None]
    if len(chosen) != 1:
        found = ", ".join(chosen) or "none"
        raise SpecError(r.path, f"exactly one of {', '.join(kinds)} must be set (found: {found})")
    if chosen[0] == "builtin":
        return BuiltinSource(alias=r.string("builtin", None) or "")
    if chosen[0] == "hostPath":
        path = r.string("hostPath", None) or ""
        if not path.startswith("/"):
            raise SpecError(r.at("hostPath"), f"must be an absolute path, got {path!r}")
        return HostPathSource(path=path)
    if chosen[0] == "pvc":
        p = r.child("pvc")
        p.only("claimName", "path")
        claim = p.string("claimName", None)
        if claim is None:
            raise SpecError(p.at("claimName"), "is required")
        sub = p.data.get("path") or ""
        if not isinstance(sub, str) or sub.startswith("/") or ".." in sub.split("/"):
            raise SpecError(p.at("path"), f"must be a relative path inside the claim, got {sub!r}")
        return PvcSource(claim_name=claim, path=sub)
    h = r.child("huggingFace")
    h.only("repo", "revision")
    repo = h.string("repo", None)
    if repo is None:
        raise SpecError(h.at("repo"), "is required")
    return HuggingFaceSource(repo=repo, revision=h.string("revision", None))


def _engine(r: _Reader, extra: tuple[str, ...] = ()) -> EngineSpec:
    r.only(
        "replicas", "image", "device", "resources", "parallelism", "kvCache", "scheduler",
        "extraArgs", "env", "nodeSelector", "tolerations", *extra,
    )  # fmt: skip
    engine = EngineSpec(
        replicas=r.integer("replicas", 1, minimum=0) or 0,
        image=r.string("image", None),
        device=r.string("device", "cpu", DEVICES) or "cpu",
        resources=_resources(r.child("resources")),
        parallelism=_parallelism(r.child("parallelism")),
        kv_cache=_kv_cache(r.child("kvCache")),
        scheduler=_scheduler(r.child("scheduler")),
        extra_args=_extra_args(r),
        env=_env(r),
        node_selector=_node_selector(r.child("nodeSelector")),
        tolerations=_tolerations(r),
    )
    _check_engine(engine, r.path)
    return engine


def _check_engine(engine: EngineSpec, path: str) -> None:
    gpus = engine.resources.gpus or 0
    if gpus and engine.device != "cuda":
        raise SpecError(f"{path}.resources.gpus", "needs device cuda")
    if gpus and gpus < engine.parallelism.ranks:
        raise SpecError(
            f"{path}.resources.gpus",
            f"{gpus} GPUs cannot hold {engine.parallelism.ranks} ranks (tp, or tp × dp "
            "without dpAttention)",
        )
    page = engine.kv_cache.page_size or 1
    chunk = engine.scheduler.chunked_prefill_size
    if chunk is not None and chunk != -1 and chunk < page:
        raise SpecError(
            f"{path}.scheduler.chunkedPrefillSize", f"must be -1 (off) or ≥ pageSize ({page})"
        )


def _resources(r: _Reader) -> Resources:
    r.only("cpu", "memory", "gpus")
    return Resources(
        cpu=_quantity(r, "cpu"), memory=_quantity(r, "memory"), gpus=r.integer("gpus", None, 0)
    )


def _quantity(r: _Reader, key: str) -> str | None:
    value = r.data.get(key)
    if value is None:
        return None
    text = str(value) if isinstance(value, int | float) and not isinstance(value, bool) else value
    if not isinstance(text, str) or not _QUANTITY.match(text):
        raise SpecError(r.at(key), f"must be a quantity (e.g. 2, 500m, 8Gi), got {value!r}")
    return text


def _parallelism(r: _Reader) -> Parallelism:
    r.only("tp", "dp", "ep", "dpAttention")
    p = Parallelism(
        tp=r.integer("tp", 1, 1) or 1,
        dp=r.integer("dp", 1, 1) or 1,
        ep=r.integer("ep", 1, 1) or 1,
        dp_attention=r.boolean("dpAttention", False),
    )
    if p.dp_attention and p.tp % p.dp:
        raise SpecError(r.at("dp"), f"must divide tp ({p.tp}) when dpAttention is true, got {p.dp}")
    if p.ep > p.tp * p.dp:
        raise SpecError(r.at("ep"), f"must be at most tp × dp ({p.tp * p.dp}), got {p.ep}")
    return p


def _kv_cache(r: _Reader) -> KVCache:
    r.only("pageSize", "memoryFraction", "maxTotalTokens", "offload")
    fraction = r.number("memoryFraction", None)
    if fraction is not None and not 0 < fraction < 1:
        raise SpecError(r.at("memoryFraction"), f"must be in (0, 1), got {fraction}")
    offload = r.data.get("offload")
    return KVCache(
        page_size=r.integer("pageSize", None, 1),
        memory_fraction=fraction,
        max_total_tokens=r.integer("maxTotalTokens", None, 1),
        offload=None if offload is None else _offload(r.child("offload")),
    )


def _positive(r: _Reader, key: str) -> float | None:
    value = r.number(key, None)
    if value is not None and not value > 0:
        raise SpecError(r.at(key), f"must be > 0, got {value}")
    return value


def _offload(r: _Reader) -> KVOffload:
    r.only("hostRatio", "hostSizeGB", "writePolicy", "storage")
    ratio, size = _positive(r, "hostRatio"), _positive(r, "hostSizeGB")
    if ratio is not None and size is not None:
        raise SpecError(r.at("hostSizeGB"), "set hostRatio or hostSizeGB, not both")
    storage = r.child("storage")
    storage.only("file", "mooncake", "prefetchPolicy")
    backends = [b for b in ("file", "mooncake") if storage.data.get(b) is not None]
    if r.data.get("storage") is not None and len(backends) != 1:
        raise SpecError(storage.path, "set exactly one of file and mooncake")
    return KVOffload(
        host_ratio=ratio,
        host_size_gb=size,
        write_policy=r.string("writePolicy", None, HICACHE_WRITE_POLICIES),
        file=_file_storage(storage.child("file")) if "file" in backends else None,
        mooncake=_mooncake(storage.child("mooncake")) if "mooncake" in backends else None,
        prefetch_policy=storage.string("prefetchPolicy", None, HICACHE_PREFETCH_POLICIES),
    )


def _file_storage(f: _Reader) -> FileStorage:
    f.only("sizeGB", "claimName")
    size_gb = _positive(f, "sizeGB")
    if size_gb is None:
        raise SpecError(f.at("sizeGB"), "is required")
    return FileStorage(size_gb, f.string("claimName", None))


def _mooncake(m: _Reader) -> MooncakeStorage:
    m.only("segmentSizeGB", "masterAddress")
    address = m.string("masterAddress", None)
    if address is not None and not HOST_PORT.fullmatch(address):
        raise SpecError(m.at("masterAddress"), f"must be host:port, got {address!r}")
    return MooncakeStorage(_positive(m, "segmentSizeGB") or 1.0, address)


def _scheduler(r: _Reader) -> Scheduler:
    r.only("policy", "chunkedPrefillSize", "maxRunningRequests")
    chunk = r.integer("chunkedPrefillSize", None, -1)
    if chunk == 0:
        raise SpecError(r.at("chunkedPrefillSize"), "must be -1 (off) or positive, got 0")
    return Scheduler(
        policy=r.string("policy", None, ENGINE_POLICIES),
        chunked_prefill_size=chunk,
        max_running_requests=r.integer("maxRunningRequests", None, 1),
    )


def _extra_args(r: _Reader) -> tuple[str, ...]:
    args = r.items("extraArgs")
    for i, arg in enumerate(args):
        if not isinstance(arg, str):
            raise SpecError(f"{r.at('extraArgs')}[{i}]", f"must be a string, got {arg!r}")
        flag = arg.split("=", 1)[0]
        if flag in MANAGED_ENGINE_FLAGS:
            raise SpecError(
                f"{r.at('extraArgs')}[{i}]",
                f"{flag} is set by the operator from {MANAGED_ENGINE_FLAGS[flag]}",
            )
    return tuple(args)


def _env(r: _Reader) -> tuple[Mapping[str, Any], ...]:
    out = []
    for i, item in enumerate(r.items("env")):
        e = _Reader(item, f"{r.at('env')}[{i}]")
        e.only("name", "value", "valueFrom")
        if e.string("name", None) is None:
            raise SpecError(e.at("name"), "is required")
        if e.data["name"] == API_KEY_ENV:
            raise SpecError(
                e.at("name"), f"{API_KEY_ENV} is set by the operator from spec.apiKeySecretRef"
            )
        value = e.data.get("value")
        if value is not None and not isinstance(value, str):
            raise SpecError(e.at("value"), f"must be a string, got {value!r}")
        if value is not None and e.data.get("valueFrom") is not None:
            raise SpecError(e.path, "set value or valueFrom, not both")
        e.child("valueFrom")  # must be an object when present
        out.append(dict(e.data))
    return tuple(out)


def _node_selector(r: _Reader) -> tuple[tuple[str, str], ...]:
    for key, value in r.data.items():
        if not isinstance(value, str):
            raise SpecError(r.at(key), f"must be a string, got {value!r}")
    return tuple(sorted(r.data.items()))


def _tolerations(r: _Reader) -> tuple[Mapping[str, Any], ...]:
    out = []
    for i, item in enumerate(r.items("tolerations")):
        t = _Reader(item, f"{r.at('tolerations')}[{i}]")
        t.only(*sorted(_TOLERATION_KEYS))
        t.string("operator", None, ("Exists", "Equal"))
        t.string("effect", None, ("NoSchedule", "PreferNoSchedule", "NoExecute"))
        t.integer("tolerationSeconds", None)
        out.append(dict(t.data))
    return tuple(out)


def _router(r: _Reader) -> RouterSpec:
    r.only("replicas", "image", "policy", "cacheAware", "adminKeySecretRef")
    c = r.child("cacheAware")
    c.only("cacheThreshold", "balanceAbsThreshold", "balanceRelThreshold")
    threshold = c.number("cacheThreshold", 0.3)
    if threshold is None or not 0 <= threshold <= 1:
        raise SpecError(c.at("cacheThreshold"), f"must be in [0, 1], got {threshold}")
    rel = c.number("balanceRelThreshold", 1.5)
    if rel is None or rel < 1:
        raise SpecError(c.at("balanceRelThreshold"), f"must be ≥ 1, got {rel}")
    return RouterSpec(
        replicas=r.integer("replicas", 1, 1) or 1,
        image=r.string("image", None),
        policy=r.string("policy", "cache_aware", ROUTER_POLICIES) or "cache_aware",
        cache_threshold=threshold,
        balance_abs_threshold=c.integer("balanceAbsThreshold", 64, 0) or 0,
        balance_rel_threshold=rel,
        admin_key=_secret_ref(r, "adminKeySecretRef", "admin-key"),
    )


def _autoscaling(r: _Reader) -> Autoscaling:
    """`spec.autoscaling`; present (even `{}`) means an HPA is wanted, so its required fields
    must be there."""
    r.only(
        "minReplicas", "maxReplicas", "metric", "targetPerReplica", "scaleDownStabilizationSeconds"
    )
    low = r.integer("minReplicas", 1, 1) or 1
    high = r.integer("maxReplicas", None, 1)
    if high is None:
        raise SpecError(r.at("maxReplicas"), "is required")
    if low > high:
        raise SpecError(r.at("minReplicas"), f"must be ≤ maxReplicas ({high}), got {low}")
    metric = r.string("metric", "requests", AUTOSCALING_METRICS) or "requests"
    target = r.number("targetPerReplica", None)
    if target is None:
        raise SpecError(r.at("targetPerReplica"), "is required")
    if metric == "kvTokenUsage" and not 0 < target <= 1:
        raise SpecError(r.at("targetPerReplica"), f"must be in (0, 1] for {metric}, got {target}")
    if target <= 0:
        raise SpecError(r.at("targetPerReplica"), f"must be > 0, got {target}")
    window = r.integer("scaleDownStabilizationSeconds", 300, 0)
    if window is not None and window > MAX_STABILIZATION_S:
        raise SpecError(
            r.at("scaleDownStabilizationSeconds"), f"must be ≤ {MAX_STABILIZATION_S}, got {window}"
        )
    return Autoscaling(
        min_replicas=low,
        max_replicas=high,
        metric=metric,
        target_per_replica=target,
        scale_down_stabilization_s=window or 0,
    )
