"""RouterConfig: every knob of the router in one frozen object, and its command-line flags.

Defaults follow sgl-router's command line (what its users get), so a user who knows
`--cache-threshold 0.3 --balance-abs-threshold 64 --balance-rel-threshold 1.5` finds them here.
Flags are derived from the fields, so the two never drift apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

# Secrets come from the environment (a Kubernetes secretKeyRef), never the command line.
SECRET_FIELDS = ("api_key", "admin_key", "worker_api_key")
SECRET_ENV_PREFIX = "RADIXSERVE_ROUTER_"
ENGINE_APIS = ("auto", "sglang", "vllm")
POLICIES = ("cache_aware", "cost", "round_robin", "random", "power_of_two", "least_load")


@dataclass(frozen=True)
class RouterConfig:
    host: str = "127.0.0.1"
    port: int = 8000
    worker_urls: tuple[str, ...] = ()
    # how workers are discovered: "auto" (SGLang's /server_info, else vLLM's endpoints),
    # "sglang" or "vllm"; one worker's own with a prefix: --worker-urls vllm+http://host:port
    engine_api: str = "auto"
    policy: str = "cache_aware"
    # cache_aware: route to the longest cached prefix unless the load is imbalanced
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    # cache_aware's load: requests + queued uncached prompt tokens / this many tokens
    load_tokens_per_request: int = 512
    # in-flight overlay: a routed prompt counts as arriving on its rank until its events
    # store it or the request ends; at most this long, and this many tokens per rank
    inflight_ttl_s: float = 60.0
    inflight_max_tokens: int = 1 << 22
    # cost: uncached prompt tokens + cost_queue_weight × tokens queued on the rank
    cost_queue_weight: float = 1.0
    # header whose value pins a session to one rank (sticky sessions); None: off
    session_header: str | None = None
    # approximate trees (ranks without KV events): per-rank token budget, LRU-trimmed
    approx_max_tokens: int = 1 << 22
    # limits under abuse (None: $RADIXSERVE_MAX_REQUEST_BODY_BYTES / $RADIXSERVE_HEADER_TIMEOUT_S,
    # else 32 MiB / 30 s, as the engine): a larger body is a 413; a connection whose request
    # headers are not complete in time is closed
    max_request_body_bytes: int | None = None
    header_timeout_s: float | None = None
    # health checks and circuit breaker
    health_check_interval_s: float = 5.0
    health_check_timeout_s: float = 5.0
    health_failure_threshold: int = 3
    health_success_threshold: int = 2
    load_check_interval_s: float = 2.0
    cb_failure_threshold: int = 10
    cb_success_threshold: int = 3
    cb_timeout_s: float = 30.0
    disable_circuit_breaker: bool = False
    # retries (only before the first byte reached the client)
    retry_max_attempts: int = 3
    retry_initial_backoff_s: float = 0.05
    retry_max_backoff_s: float = 2.0
    connect_timeout_s: float = 5.0
    request_timeout_s: float = 1800.0
    # bearer keys, never in repr (or logs); each also read from $RADIXSERVE_ROUTER_<FIELD>:
    # api_key: what clients must send (None: open); admin_key: opens GET/POST/DELETE /workers
    # (None: the admin API is closed); worker_api_key: what the router sends to the workers
    api_key: str | None = field(default=None, repr=False)
    admin_key: str | None = field(default=None, repr=False)
    worker_api_key: str | None = field(default=None, repr=False)
    # Kubernetes discovery: EndpointSlices of a Service, ports by name
    k8s_service: str | None = None
    k8s_namespace: str | None = None
    k8s_http_port_name: str = "http"
    k8s_kv_events_port_name: str = "kv-events"
    # tokenizer: fetched from a worker's /get_tokenizer unless a local tokenizer.json is given
    tokenizer_path: str | None = None
    extra: dict[str, Any] = field(default_factory=dict, compare=False)

    def __post_init__(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy: expected one of {', '.join(POLICIES)}, got {self.policy!r}")
        if self.engine_api not in ENGINE_APIS:
            raise ValueError(
                f"engine_api: expected one of {', '.join(ENGINE_APIS)}, got {self.engine_api!r}"
            )
        if not 0.0 <= self.cache_threshold <= 1.0:
            raise ValueError(f"cache_threshold: must be in [0, 1], got {self.cache_threshold}")
        if self.balance_rel_threshold < 1.0:
            raise ValueError(
                f"balance_rel_threshold: must be ≥ 1, got {self.balance_rel_threshold}"
            )
        if self.load_tokens_per_request < 1:
            raise ValueError(
                f"load_tokens_per_request: must be ≥ 1, got {self.load_tokens_per_request}"
            )
        if not self.inflight_ttl_s > 0 or self.inflight_max_tokens < 0:
            raise ValueError(
                f"inflight_ttl_s / inflight_max_tokens: must be > 0 / ≥ 0, got "
                f"{self.inflight_ttl_s} / {self.inflight_max_tokens}"
            )
        for name in ("max_request_body_bytes", "header_timeout_s"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name}: must be > 0, got {value}")
        if self.retry_max_attempts < 1:
            raise ValueError(f"retry_max_attempts: must be ≥ 1, got {self.retry_max_attempts}")
        if self.k8s_service and self.worker_urls:
            raise ValueError("worker_urls: pass either --worker-urls or --k8s-service, not both")


_HELP = MappingProxyType(
    {
        "worker_urls": "worker URLs, e.g. http://127.0.0.1:30000 (repeatable / space-separated)",
        "policy": "routing policy",
        "engine_api": (
            "how workers describe themselves: auto (SGLang /server_info, else vLLM's /v1/models,"
            " /kv_event_sources, /metrics), sglang or vllm; per worker: vllm+http://host:port"
        ),
        "session_header": (
            "request header that pins a session to one worker DP rank (sticky sessions)"
        ),
        "api_key": "bearer key clients must send (all but /health, /readiness and the admin API)",
        "admin_key": "bearer key that opens GET/POST/DELETE /workers",
        "worker_api_key": "bearer key the router sends to the workers",
        "k8s_service": "discover workers from the EndpointSlices of this Service",
        "tokenizer_path": "local tokenizer.json (default: fetched from a worker)",
        "load_tokens_per_request": (
            "cache_aware: queued uncached prompt tokens that weigh as much as one request"
        ),
        "inflight_ttl_s": "longest a routed prompt counts as arriving without its KV events",
        "inflight_max_tokens": "per-rank token budget of the in-flight overlay",
        "max_request_body_bytes": "a larger request body is a 413 (default 32 MiB)",
        "header_timeout_s": "close a connection whose request headers take longer (default 30)",
        "host": "address the router binds",
        "port": "HTTP port",
        "cache_threshold": (
            "cache_aware: route to the longest cached prefix when it covers more than this "
            "fraction of the prompt"
        ),
        "balance_abs_threshold": (
            "cache_aware: the load is imbalanced when max - min exceeds this (and the relative "
            "threshold): then the least-loaded rank gets the request"
        ),
        "balance_rel_threshold": "cache_aware: ... and when max exceeds min times this",
        "cost_queue_weight": "cost: uncached prompt tokens + this x the tokens queued there",
        "approx_max_tokens": "per-rank token budget of the trees of workers without KV events",
        "health_check_interval_s": "seconds between health checks of each worker",
        "health_check_timeout_s": "a health check slower than this fails",
        "health_failure_threshold": "consecutive failed checks that take a worker out",
        "health_success_threshold": "consecutive passed checks that bring it back",
        "load_check_interval_s": "seconds between polls of each worker's load",
        "cb_failure_threshold": "circuit breaker: consecutive failed requests that open it",
        "cb_success_threshold": "circuit breaker: consecutive successes that close it again",
        "cb_timeout_s": "circuit breaker: seconds open before one probe request may go through",
        "disable_circuit_breaker": "never take a worker out for failed requests",
        "retry_max_attempts": "tries per request, retried only before the first byte is sent",
        "retry_initial_backoff_s": "the first retry's backoff (x1.5 per retry after)",
        "retry_max_backoff_s": "the longest backoff between retries",
        "connect_timeout_s": "connecting to a worker slower than this fails",
        "request_timeout_s": "a proxied request slower than this fails",
        "k8s_namespace": "namespace of --k8s-service (default: the pod's own, else default)",
        "k8s_http_port_name": "EndpointSlice port name of the workers' HTTP port",
        "k8s_kv_events_port_name": "EndpointSlice port name of the workers' KV-event port",
    }
)


def add_router_args(parser: argparse.ArgumentParser) -> None:
    for f in dataclasses.fields(RouterConfig):
        if f.name == "extra":
            continue
        flag = "--" + f.name.replace("_", "-")
        help_text = _HELP.get(f.name)
        if f.type == "bool":
            parser.add_argument(flag, action="store_true", help=help_text)
        elif f.name == "worker_urls":
            parser.add_argument(flag, nargs="*", default=[], help=help_text)
        elif f.name == "policy":
            parser.add_argument(flag, default=f.default, choices=POLICIES, help=help_text)
        elif f.name == "engine_api":
            parser.add_argument(flag, default=f.default, choices=ENGINE_APIS, help=help_text)
        else:
            kind = {"int": int, "float": float}.get(str(f.type).split(" ")[0], str)
            if f.name in SECRET_FIELDS:
                env = SECRET_ENV_PREFIX + f.name.upper()
                help_text = f"{help_text} (default: ${env}, which keeps it off the command line)"
            parser.add_argument(flag, type=kind, default=f.default, help=help_text)


def config_from_namespace(
    ns: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> RouterConfig:
    values: dict[str, Any] = {}
    for f in dataclasses.fields(RouterConfig):
        if f.name == "extra" or not hasattr(ns, f.name):
            continue
        values[f.name] = getattr(ns, f.name)
    for name in SECRET_FIELDS:
        if values.get(name) is None:
            values[name] = environ.get(SECRET_ENV_PREFIX + name.upper()) or None
    urls: list[str] = []
    for item in values.get("worker_urls", ()):  # accept "a,b" as well as "a b"
        urls.extend(u for u in item.replace(",", " ").split() if u)
    values["worker_urls"] = tuple(u.rstrip("/") for u in urls)
    return RouterConfig(**values)
