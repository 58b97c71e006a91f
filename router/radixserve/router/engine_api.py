"""How the router learns what a worker is and how busy it is, per kind of engine.

- `sglang` (radixserve, SGLang): `GET /server_info` gives page size, DP size and the KV-event
  publishers (`kv_events`), `/model_info` the served name, `/get_load` the queue per DP rank.
- `vllm` (vLLM 0.32): no `/server_info` or `/get_load`. `/v1/models` names the model,
  `GET /kv_event_sources` lists the KV-event publishers per DP rank (`{rank: KVEventsConfig}`,
  `{}` when events are off), `/metrics` gives the block size (`vllm:cache_config_info`) and the
  queue (`vllm:num_requests_running` + `vllm:num_requests_waiting`, per `engine` = DP rank).
- `auto` (the default) asks `/server_info` first; a 404 there means a vLLM-style engine.

A worker that cannot be used yet raises `NotReady` with a short reason that stays the same
while the cause lasts, so the registry can log it once per change instead of every check.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from radixserve.router.addresses import KVEndpoint
from radixserve.router.config import ENGINE_APIS

VLLM_DEFAULT_BLOCK_SIZE = 16  # vLLM's default when /metrics does not say

Get = Callable[[str], Awaitable[httpx.Response]]  # path → the worker's response


class NotReady(ValueError):
    """Why a worker is not usable yet (a stable, short reason)."""


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker's engine says about itself when probed."""

    api: str  # "sglang" | "vllm": what the worker turned out to speak
    model_name: str | None
    page_size: int
    dp_size: int
    kv_endpoints: tuple[KVEndpoint, ...]
    # KV pool size in tokens per DP rank (`max_total_num_tokens`); () when the engine says not
    max_total_tokens: tuple[int, ...] = ()
    # HiCache storage per DP rank (`dp_ranks[].hicache_storage_id`): equal ids share pages
    storage_ids: tuple[str | None, ...] = ()


@dataclass(frozen=True)
class ReportedLoad:
    """One rank's queue as the worker's engine reports it at a load poll."""

    dp_rank: int
    num_reqs: int  # running + waiting requests on that rank
    num_used_tokens: int = 0


def split_engine_api(url: str) -> tuple[str | None, str]:
    """`vllm+http://h:p` → ("vllm", "http://h:p"); a plain URL → (None, url)."""
    head, sep, rest = url.partition("+")
    if sep and head in ENGINE_APIS and "://" not in head:
        return head, rest
    return None, url


async def _json(get: Get, path: str) -> Any:
    try:
        resp = await get(path)
    except httpx.HTTPError as exc:
        raise NotReady(f"{path}: {type(exc).__name__}") from exc
    if resp.status_code != 200:
        raise NotReady(f"{path} answered {resp.status_code}")
    try:
        return resp.json()
    except ValueError as exc:
        raise NotReady(f"{path}: not JSON") from exc


def parse_kv_endpoints(info: dict[str, Any]) -> tuple[KVEndpoint, ...]:
    """SGLang-style `/server_info` `kv_events`: a list of {dp_rank, endpoint, replay, topic}."""
    out = []
    for entry in info.get("kv_events") or ():
        out.append(
            KVEndpoint(
                dp_rank=int(entry.get("dp_rank", 0)),
                endpoint=entry["endpoint"],  # 0.0.0.0 → the worker's host: CacheIndex does it
                replay_endpoint=entry.get("replay_endpoint"),
                topic=entry.get("topic", ""),
            )
        )
    return tuple(out)


def parse_pool_sizes(info: dict[str, Any]) -> tuple[int, ...]:
    """KV pool size per DP rank from `/server_info`: radixserve's `dp_ranks[].max_total_num_tokens`,
    else SGLang's `max_total_num_tokens` for every rank; () when missing or not a positive int."""
    ranks = info.get("dp_ranks")
    sizes = (
        [r.get("max_total_num_tokens") for r in ranks if isinstance(r, dict)]
        if isinstance(ranks, list)
        else []
    )
    if not sizes:
        dp = max(1, int(info.get("dp_size") or 1))
        sizes = [info.get("max_total_num_tokens")] * dp
    pools = tuple(n for n in sizes if isinstance(n, int) and not isinstance(n, bool) and n > 0)
    return pools if len(pools) == len(sizes) else ()


def parse_storage_ids(info: dict[str, Any]) -> tuple[str | None, ...]:
    """Each DP rank's HiCache storage id from radixserve's `/server_info` (None: no storage
    tier, or an engine that does not say)."""
    ranks = info.get("dp_ranks")
    if not isinstance(ranks, list):
        return ()
    ids = [r.get("hicache_storage_id") if isinstance(r, dict) else None for r in ranks]
    return tuple(i if isinstance(i, str) and i else None for i in ids)


def parse_vllm_sources(sources: Any) -> tuple[KVEndpoint, ...]:
    """vLLM's `/kv_event_sources`: {rank: KVEventsConfig}; ranks without a zmq publisher or
    with events off are skipped (`tcp://*:port` is dialled on the worker's host)."""
    if not isinstance(sources, dict):
        raise NotReady("/kv_event_sources: expected a JSON object")
    out = []
    for rank, cfg in sorted(sources.items(), key=lambda kv: int(kv[0])):
        if not isinstance(cfg, dict) or not cfg.get("enable_kv_cache_events"):
            continue
        if cfg.get("publisher") != "zmq" or not cfg.get("endpoint"):
            continue
        replay = cfg.get("replay_endpoint") or None
        out.append(KVEndpoint(int(rank), cfg["endpoint"], replay, cfg.get("topic") or ""))
    return tuple(out)


def vllm_block_size(metrics_text: str) -> int | None:
    """`block_size` label of `vllm:cache_config_info`, if the server exports it."""
    for family in text_string_to_metric_families(metrics_text):
        if family.name.startswith("vllm:cache_config_info"):
            for sample in family.samples:
                size = sample.labels.get("block_size")
                if size and size.isdigit():
                    return int(size)
    return None


def vllm_loads(metrics_text: str) -> list[ReportedLoad]:
    """Running + waiting requests per `engine` label (vLLM's DP rank) from `/metrics`."""
    reqs: dict[int, float] = {}
    for family in text_string_to_metric_families(metrics_text):
        if family.name not in ("vllm:num_requests_running", "vllm:num_requests_waiting"):
            continue
        for sample in family.samples:
            label = sample.labels.get("engine", "0")  # vLLM's label for the DP rank
            rank = int(label) if label.isdigit() else 0
            reqs[rank] = reqs.get(rank, 0.0) + sample.value
    return [ReportedLoad(rank, int(n)) for rank, n in sorted(reqs.items())]


async def _probe_sglang(get: Get, info: Any) -> WorkerInfo:
    if not isinstance(info, dict):
        raise NotReady("/server_info: expected a JSON object")
    try:
        model = await _json(get, "/model_info")
    except NotReady:
        model = {}  # the name is informational; SGLang versions differ in this route
    name = (model if isinstance(model, dict) else {}).get("served_model_name")
    return WorkerInfo(
        "sglang",
        name or info.get("served_model_name"),
        int(info.get("page_size") or 1),
        max(1, int(info.get("dp_size") or 1)),
        parse_kv_endpoints(info),
        parse_pool_sizes(info),
        parse_storage_ids(info),
    )


async def _probe_vllm(get: Get) -> WorkerInfo:
    models = await _json(get, "/v1/models")
    data = models.get("data") if isinstance(models, dict) else None
    if not data:
        raise NotReady("/v1/models: no model served yet")
    try:
        kv = parse_vllm_sources(await _json(get, "/kv_event_sources"))
    except NotReady as exc:
        if "answered 404" not in str(exc):
            raise
        kv = ()  # a vLLM before /kv_event_sources: routed approximately
    try:
        resp = await get("/metrics")
        block = vllm_block_size(resp.text) if resp.status_code == 200 else None
    except httpx.HTTPError:
        block = None
    if kv and block is None:
        raise NotReady("/metrics: no vllm:cache_config_info block_size (KV events need it)")
    return WorkerInfo(
        "vllm",
        data[0].get("id"),
        block or VLLM_DEFAULT_BLOCK_SIZE,
        max([e.dp_rank for e in kv], default=0) + 1,
        kv,
    )


async def probe_worker(get: Get, api: str = "auto") -> WorkerInfo:
    """What the worker is; raises NotReady naming what is missing."""
    if api == "vllm":
        return await _probe_vllm(get)
    try:
        return await _probe_sglang(get, await _json(get, "/server_info"))
    except NotReady as exc:
        if api == "auto" and str(exc) == "/server_info answered 404":
            return await _probe_vllm(get)
        raise


async def reported_loads(get: Get, api: str) -> list[ReportedLoad]:
    """The engine's own queue per DP rank; [] when it cannot say (no poll counts as idle)."""
    try:
        if api == "vllm":
            resp = await get("/metrics")
            return vllm_loads(resp.text) if resp.status_code == 200 else []
        resp = await get("/get_load")
        if resp.status_code != 200:
            return []
        body = resp.json()
    except (httpx.HTTPError, ValueError):
        return []  # the health checks decide what an unreachable worker means
    out = []
    for entry in body if isinstance(body, list) else [body]:
        if isinstance(entry, dict):
            out.append(
                ReportedLoad(
                    int(entry.get("dp_rank") or 0),
                    int(entry.get("num_reqs") or 0),
                    int(entry.get("num_used_tokens") or 0),
                )
            )
    return out
