"""ChunkCache: the prefix cache used with --disable-radix-cache. Nothing is shared; it only
remembers a chunked request's own KV between chunks and frees everything at finish."""

from __future__ import annotations

import torch

from radixserve.engine.mem_cache.allocator import BaseTokenAllocator
from radixserve.engine.mem_cache.base_prefix_cache import (
    BasePrefixCache,
    CachedReq,
    MatchResult,
    PrefixPeek,
)
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool


class ChunkCache(BasePrefixCache):
    def __init__(self, req_to_token_pool: ReqToTokenPool, allocator: BaseTokenAllocator) -> None:
        self.req_to_token_pool = req_to_token_pool
        self.allocator = allocator

    def match_prefix(self, key: list[int]) -> MatchResult:
        return MatchResult(torch.empty(0, dtype=torch.int64, device=self.allocator.device), None)

    def peek_prefix(self, key: list[int]) -> PrefixPeek:
        return PrefixPeek(0, None)

    def cache_unfinished_req(self, req: CachedReq) -> None:
        assert req.req_pool_idx is not None
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        req.prefix_indices = row[: len(req.fill_ids)].to(torch.int64).clone()

    def cache_finished_req(self, req: CachedReq, is_insert: bool = True) -> None:
        assert req.req_pool_idx is not None
        kv_len = req.kv_allocated_len
        row = self.req_to_token_pool.req_to_token[req.req_pool_idx]
        self.allocator.free(row[:kv_len].to(torch.int64))
        self.req_to_token_pool.free(req.req_pool_idx)
        req.req_pool_idx = None
        req.prefix_indices = torch.empty(0, dtype=torch.int64, device=self.allocator.device)

    def evict(self, num_tokens: int) -> int:
        return 0

    def reset(self) -> None:
        pass
