"""Which prefix cache a scheduler rank keeps, built from its ServerArgs: none (ChunkCache), the
radix tree, or the radix tree over host and storage tiers (HiCache)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.ipc.messages import HiCacheLoad
from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache
from radixserve.engine.mem_cache.chunk_cache import ChunkCache
from radixserve.engine.mem_cache.hicache_mooncake import HiCacheMooncake, MooncakeConfig
from radixserve.engine.mem_cache.hicache_prefetch import PrefetchConfig
from radixserve.engine.mem_cache.hicache_storage import HiCacheFile, HiCacheStorage, StorageConfig
from radixserve.engine.mem_cache.hiradix_cache import HiCacheConfig, HiRadixCache
from radixserve.engine.mem_cache.memory_pool_host import host_pool_tokens
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.model_executor.model_runner import ModelRunner
from radixserve.engine.scheduler.disagg_common import advertised_host


def make_tree_cache(args: ServerArgs, runner: ModelRunner) -> BasePrefixCache:
    # SGLang's decode keeps no radix cache unless asked (the prefill caches prompts)
    decode_without_tree = (
        args.disaggregation_mode == "decode" and not args.disaggregation_decode_enable_radix_cache
    )
    if args.disable_radix_cache or decode_without_tree:
        return ChunkCache(runner.req_to_token_pool, runner.allocator)
    events = args.kv_events_port is not None  # this rank publishes: record events
    if not args.enable_hierarchical_cache:
        return RadixCache(
            runner.req_to_token_pool,
            runner.allocator,
            args.page_size,
            args.radix_eviction_policy,
            events,
        )
    pool = runner.token_to_kv_pool
    group = runner.groups.attn_cpu  # the ranks that schedule together agree on sizes and hits
    tokens = host_pool_tokens(pool, args.hicache_ratio, args.hicache_size, args.page_size)
    options = args.hicache_storage_options()
    config = HiCacheConfig(
        host_size=group.min_int(tokens),
        write_policy=args.hicache_write_policy,
        storage=_storage(args, options, runner),
        prefetch=_prefetch(args, options),
        agree_min=group.min_int if group.size > 1 else None,
    )
    return HiRadixCache(
        runner.req_to_token_pool,
        runner.allocator,
        pool,
        config,
        args.page_size,
        args.radix_eviction_policy,
        events,
    )


def _prefetch(args: ServerArgs, options: dict[str, Any]) -> PrefetchConfig:
    return PrefetchConfig(
        policy=args.hicache_storage_prefetch_policy,
        threshold=int(options["prefetch_threshold"]),
        timeout_base=float(options["prefetch_timeout_base"]),
        timeout_per_ki_token=float(options["prefetch_timeout_per_ki_token"]),
    )


def _storage(
    args: ServerArgs, options: dict[str, Any], runner: ModelRunner
) -> HiCacheStorage | None:
    if args.hicache_storage_backend is None:
        return None
    dtype = str(runner.token_to_kv_pool.dtype).removeprefix("torch.")
    tag = f"{args.served_model_name or args.model_path}-{dtype}"
    tp = runner.groups.attn_tp  # each attention-TP rank holds (and stores) its own heads
    if args.hicache_storage_backend == "mooncake":
        return HiCacheMooncake(
            MooncakeConfig(
                master_server_address=options["master_server_address"],
                model_tag=tag,
                tp_rank=tp.rank,
                tp_size=tp.size,
                local_hostname=options["local_hostname"] or advertised_host(args.host),
                protocol=options["protocol"],
                device_name=options["device_name"],
                global_segment_size=int(options["global_segment_size"]),
                local_buffer_size=int(options["local_buffer_size"]),
            )
        )
    config = StorageConfig(
        path=Path(options["file_storage_path"]),
        capacity_bytes=int(float(options["file_storage_max_size_gb"]) * (1 << 30)),
        model_tag=tag,
        tp_rank=tp.rank,
        tp_size=tp.size,
    )
    return HiCacheFile(config)


def hicache_load(cache: BasePrefixCache) -> HiCacheLoad | None:
    """HiCache's counters for the load snapshot (None without HiCache)."""
    if not isinstance(cache, HiRadixCache):
        return None
    s, storage, prefetcher = cache.stats, cache.storage, cache.prefetcher
    return HiCacheLoad(
        device_hit_tokens=s.device_hit_tokens,
        host_hit_tokens=s.host_hit_tokens,
        storage_hit_tokens=s.storage_hit_tokens,
        load_back_tokens=s.load_back_tokens,
        load_back_bytes=s.load_back_bytes,
        load_back_seconds=s.load_back_seconds,
        backup_tokens=s.backup_tokens,
        dropped_tokens=s.dropped_tokens,
        host_used_tokens=cache.host_tokens(),
        host_total_tokens=cache.host.size,
        storage_pending_writes=0 if storage is None else storage.pending_writes(),
        storage_used_bytes=0 if storage is None else storage.used_bytes(),
        prefetched_tokens=s.prefetch_tokens,
        prefetch_deferrals=s.prefetch_deferrals,
        prefetch_lost_tokens=s.prefetch_lost_tokens,
        prefetch_staged_bytes=0 if prefetcher is None else prefetcher.staged_bytes(),
    )


def storage_id(cache: BasePrefixCache) -> str | None:
    """What the rank's storage tier reads (replicas with the same id share pages), or None."""
    if isinstance(cache, HiRadixCache) and cache.storage is not None:
        return cache.storage.storage_id()
    return None
