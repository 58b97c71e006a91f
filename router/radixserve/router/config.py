"""RouterConfig: every knob of the router in one frozen object, and its command-line flags.

Defaults follow sgl-router's command line (what its users get), so a user who knows
`--cache-threshold 0.3 --balance-abs-threshold 64 --balance-rel-threshold 1.5` finds them here.
Each field is its flag, with its help and choices (radixserve.config_options), so the two never
drift apart; the policy names are the keys of the policy registry (router.policies).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from radixserve.config_options import (
    NOT_A_FLAG,
    add_dataclass_args,
    check_choices,
    namespace_values,
    option,
)
from radixserve.router.policies import POLICIES

ENGINE_APIS = ("auto", "sglang", "vllm")


@dataclass(frozen=True)
class RouterConfig:
    """Every field but `extra` is a flag of `radixserve router` (radixserve.config_options):
    its help and choices are in its metadata, and the choices are checked here too."""

    host: str = option("127.0.0.1", "address the router binds")
    port: int = option(8000, "HTTP port")
    worker_urls: tuple[str, ...] = option(
        (),
        "worker URLs, e.g. http://127.0.0.1:30000 (repeatable / space-separated)",
        nargs="*",
    )
    engine_api: str = option(
        "auto",
        "how workers describe themselves: auto (SGLang /server_info, else vLLM's /v1/models, "
        "/kv_event_sources, /metrics), sglang or vllm; per worker: vllm+http://host:port",
        choices=ENGINE_APIS,
    )
    policy: str = option("cache_aware", "routing policy", choices=tuple(POLICIES))
    # cache_aware: route to the longest cached prefix unless the load is imbalanced
    cache_threshold: float = option(
        0.3,
        "cache_aware: route to the longest cached prefix when it covers more than this "
        "fraction of the prompt",
    )
    balance_abs_threshold: int = option(
        64,
        "cache_aware: the load is imbalanced when max - min exceeds this (and the relative "
        "threshold): then the least-loaded rank gets the request",
    )
    balance_rel_threshold: float = option(
        1.5, "cache_aware: ... and when max exceeds min times this"
    )
    # cache_aware's load: requests + queued uncached prompt tokens / this many tokens
    load_tokens_per_request: int = option(
        512, "cache_aware: queued uncached prompt tokens that weigh as much as one request"
    )
    # in-flight overlay: a routed prompt counts as arriving on its rank until its events
    # store it or the request ends; at most this long, and this many tokens per rank
    inflight_ttl_s: float = option(
        60.0, "longest a routed prompt counts as arriving without its KV events"
    )
    inflight_max_tokens: int = option(1 << 22, "per-rank token budget of the in-flight overlay")
    cost_queue_weight: float = option(
        1.0, "cost: uncached prompt tokens + this x the tokens queued there"
    )
    session_header: str | None = option(
        None, "request header that pins a session to one worker DP rank (sticky sessions)"
    )
    # tier-aware scoring (HiCache): a prefix only in a lower tier is loaded back, not recomputed
    cache_tier_credit: str = option(
        "host=0.75,storage=0.5",
        "how much a prefix held only in a worker's host tier, or only in the storage it reads, "
        "counts, as a fraction of one held in its KV pool (host=F,storage=G, each in [0, 1]; "
        "0: tier-blind)",
    )
    # approximate trees (ranks without KV events): per-rank token budget, LRU-trimmed
    approx_max_tokens: int = option(
        1 << 22, "per-rank token budget of the trees of workers without KV events"
    )
    # limits under abuse (None: $RADIXSERVE_MAX_REQUEST_BODY_BYTES / $RADIXSERVE_HEADER_TIMEOUT_S,
    # else 32 MiB / 30 s, as the engine)
    max_request_body_bytes: int | None = option(
        None, "a larger request body is a 413 (default 32 MiB)"
    )
    header_timeout_s: float | None = option(
        None, "close a connection whose request headers take longer (default 30)"
    )
    # health checks and circuit breaker
    health_check_interval_s: float = option(5.0, "seconds between health checks of each worker")
    health_check_timeout_s: float = option(5.0, "a health check slower than this fails")
    health_failure_threshold: int = option(3, "consecutive failed checks that take a worker out")
    health_success_threshold: int = option(2, "consecutive passed checks that bring it back")
    load_check_interval_s: float = option(2.0, "seconds between polls of each worker's load")
    cb_failure_threshold: int = option(
        10, "circuit breaker: consecutive failed requests that open it"
    )
    cb_success_threshold: int = option(
        3, "circuit breaker: consecutive successes that close it again"
    )
    cb_timeout_s: float = option(
        30.0, "circuit breaker: seconds open before one probe request may go through"
    )
    disable_circuit_breaker: bool = option(False, "never take a worker out for failed requests")
    # retries (only before the first byte reached the client)
    retry_max_attempts: int = option(
        3, "tries per request, retried only before the first byte is sent"
    )
    retry_initial_backoff_s: float = option(
        0.05, "the first retry's backoff (x1.5 per retry after)"
    )
    retry_max_backoff_s: float = option(2.0, "the longest backoff between retries")
    connect_timeout_s: float = option(5.0, "connecting to a worker slower than this fails")
    request_timeout_s: float = option(1800.0, "a proxied request slower than this fails")
    # Bearer keys: never in repr (or logs), and read from the environment (a Kubernetes
    # secretKeyRef) when not given, so they can stay off the command line.
    api_key: str | None = option(
        None,
        "bearer key clients must send (all but /health, /readiness and the admin API)",
        env="RADIXSERVE_ROUTER_API_KEY",
        repr=False,
    )
    admin_key: str | None = option(  # None: the admin API is closed
        None,
        "bearer key that opens GET/POST/DELETE /workers",
        env="RADIXSERVE_ROUTER_ADMIN_KEY",
        repr=False,
    )
    worker_api_key: str | None = option(
        None,
        "bearer key the router sends to the workers",
        env="RADIXSERVE_ROUTER_WORKER_API_KEY",
        repr=False,
    )
    # Kubernetes discovery: EndpointSlices of a Service, ports by name
    k8s_service: str | None = option(
        None, "discover workers from the EndpointSlices of this Service"
    )
    k8s_namespace: str | None = option(
        None, "namespace of --k8s-service (default: the pod's own, else default)"
    )
    k8s_http_port_name: str = option("http", "EndpointSlice port name of the workers' HTTP port")
    k8s_kv_events_port_name: str = option(
        "kv-events", "EndpointSlice port name of the workers' KV-event port"
    )
    tokenizer_path: str | None = option(
        None, "local tokenizer.json (default: fetched from a worker)"
    )
    # prefill/decode disaggregation: sglang-router's PD mode (router/pd.py); --prefill URL
    # [BOOTSTRAP_PORT] and --decode URL are added by add_router_args (repeatable, 1-2 values)
    pd_disaggregation: bool = option(
        False, "prefill/decode disaggregation: each request to a --prefill and a --decode worker"
    )
    prefill_policy: str | None = option(
        None, "PD: the prefill pool's policy (default: --policy, cache-aware on its KV events)"
    )
    decode_policy: str | None = option(
        None, "PD: the decode pool's policy (default: power_of_two, by load)"
    )
    k8s_prefill_service: str | None = option(
        None, "PD: discover the prefill pool from this Service's EndpointSlices"
    )
    k8s_decode_service: str | None = option(
        None, "PD: discover the decode pool from this Service's EndpointSlices"
    )
    k8s_bootstrap_port: int | None = option(
        None, "PD: the bootstrap port of discovered prefill workers (default: none)"
    )
    prefill_urls: tuple[str, ...] = field(default=(), metadata=NOT_A_FLAG)
    prefill_bootstrap_ports: Mapping[str, int | None] = field(
        default_factory=dict, compare=False, metadata=NOT_A_FLAG
    )
    decode_urls: tuple[str, ...] = field(default=(), metadata=NOT_A_FLAG)
    extra: dict[str, Any] = field(default_factory=dict, compare=False, metadata=NOT_A_FLAG)

    def __post_init__(self) -> None:
        check_choices(self)
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
        self.tier_credits()  # a malformed --cache-tier-credit fails at start-up
        self._check_pd()

    def tier_credits(self) -> dict[str, float]:
        """--cache-tier-credit parsed: {"host": F, "storage": G} (a tier not named: 0)."""
        name, out = "cache_tier_credit", {}
        for part in filter(None, (p.strip() for p in self.cache_tier_credit.split(","))):
            tier, sep, value = part.partition("=")
            if tier not in ("host", "storage") or not sep:
                raise ValueError(f"{name}: expected host=F and/or storage=G, got {part!r}")
            try:
                credit = float(value)
            except ValueError:
                raise ValueError(f"{name}: {tier}: not a number: {value!r}") from None
            if not 0.0 <= credit <= 1.0:
                raise ValueError(f"{name}: {tier}: must be in [0, 1], got {credit}")
            out[tier] = credit
        return out

    def _check_pd(self) -> None:
        for name in ("prefill_policy", "decode_policy"):
            value = getattr(self, name)
            if value is not None and value not in POLICIES:
                raise ValueError(f"{name}: must be one of {sorted(POLICIES)}, got {value!r}")
        if not self.pd_disaggregation:
            if self.prefill_urls or self.decode_urls:
                raise ValueError("prefill: --prefill / --decode need --pd-disaggregation")
            return
        if not (self.prefill_urls or self.k8s_prefill_service) or not (
            self.decode_urls or self.k8s_decode_service
        ):
            raise ValueError(
                "pd_disaggregation: needs prefill and decode workers (--prefill / --decode, or "
                "--k8s-prefill-service / --k8s-decode-service)"
            )
        if self.worker_urls or self.k8s_service:
            raise ValueError(
                "worker_urls: --pd-disaggregation takes --prefill / --decode, not --worker-urls "
                "or --k8s-service"
            )

    @property
    def pd_prefill_policy(self) -> str:
        return self.prefill_policy or self.policy

    @property
    def pd_decode_policy(self) -> str:
        return self.decode_policy or "power_of_two"


def add_router_args(parser: argparse.ArgumentParser) -> None:
    add_dataclass_args(parser, RouterConfig)
    parser.add_argument(
        "--prefill",
        nargs="+",
        action="append",
        metavar=("URL", "BOOTSTRAP_PORT"),
        default=[],
        help="PD: a prefill worker and its bootstrap port (or none: the decode's default); "
        "repeatable",
    )
    parser.add_argument(
        "--decode",
        action="append",
        metavar="URL",
        default=[],
        help="PD: a decode worker; repeatable",
    )


def pd_workers(
    prefill: list[list[str]], decode: list[str]
) -> tuple[tuple[str, ...], dict[str, int | None], tuple[str, ...]]:
    """sglang-router's --prefill URL [PORT|none] ... and --decode URL ... lists."""
    urls: list[str] = []
    ports: dict[str, int | None] = {}
    for item in prefill:
        if len(item) > 2:
            raise ValueError(f"prefill: expected URL [BOOTSTRAP_PORT], got {' '.join(item)}")
        url = item[0].rstrip("/")
        port = item[1] if len(item) == 2 else "none"
        if port.lower() != "none" and not (port.isdigit() and 0 < int(port) < 65536):
            raise ValueError(f"prefill: bootstrap port must be a port or none, got {port!r}")
        urls.append(url)
        ports[url] = None if port.lower() == "none" else int(port)
    return tuple(urls), ports, tuple(u.rstrip("/") for u in decode)


def config_from_namespace(
    ns: argparse.Namespace, environ: Mapping[str, str] = os.environ
) -> RouterConfig:
    """RouterConfig from the parsed flags; the keys fall back to $RADIXSERVE_ROUTER_<FIELD>,
    and --worker-urls takes "a,b" as well as "a b"."""
    values = namespace_values(RouterConfig, ns, environ)
    urls: list[str] = []
    for item in values.get("worker_urls", ()):
        urls.extend(u for u in item.replace(",", " ").split() if u)
    values["worker_urls"] = tuple(u.rstrip("/") for u in urls)
    prefill, ports, decode = pd_workers(getattr(ns, "prefill", []), getattr(ns, "decode", []))
    values.update(prefill_urls=prefill, prefill_bootstrap_ports=ports, decode_urls=decode)
    return RouterConfig(**values)
