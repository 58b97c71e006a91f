"""Two-level KV memory: request rows → token slots → per-layer K/V buffers, and prefix caches."""

from radixserve.engine.mem_cache.allocator import (
    BaseTokenAllocator,
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    create_allocator,
)
from radixserve.engine.mem_cache.memory_pool import (
    MHATokenToKVPool,
    MLATokenToKVPool,
    ReqToTokenPool,
)

__all__ = [
    "BaseTokenAllocator",
    "MHATokenToKVPool",
    "MLATokenToKVPool",
    "PagedTokenToKVPoolAllocator",
    "ReqToTokenPool",
    "TokenToKVPoolAllocator",
    "create_allocator",
]
