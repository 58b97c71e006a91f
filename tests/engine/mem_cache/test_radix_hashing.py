"""Page hashes are computed for the KV-event stream only: never with events off, and with
events on they equal the protocol's block hashes (the golden definition)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from radixserve.engine.mem_cache import radix_cache
from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.protocol import block_hashes, digest_to_int64
from radixserve.protocol.block_hash import hash_pages

CPU = torch.device("cpu")
PAGE = 4
A = list(range(100, 116))  # four pages
B = A[:8] + list(range(200, 208))  # shares two pages with A


def make_cache(events: bool) -> RadixCache:
    alloc = create_allocator(256, PAGE, CPU)
    return RadixCache(ReqToTokenPool(4, 512, CPU), alloc, PAGE, "lru", enable_events=events)


def put(cache: RadixCache, tokens: list[int]) -> None:
    slots = cache.allocator.alloc_extend([0], [len(tokens)], [-1])
    assert slots is not None
    prefix = cache.insert(list(tokens), slots)
    cache.allocator.free(slots[:prefix])


@pytest.fixture()
def hash_calls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        return hash_pages(*args, **kwargs)

    monkeypatch.setattr(radix_cache, "hash_pages", counting)
    return calls


def test_no_hashing_with_events_off(hash_calls: list[int]) -> None:
    cache = make_cache(events=False)
    put(cache, A)
    put(cache, B)  # a split and a new leaf
    assert cache.match_prefix(B).indices.numel() == len(B)
    assert hash_calls == []
    assert cache.cached_page_hashes() == []
    cache.evict(len(A) + len(B))
    assert cache.take_events() == []


def test_hashes_with_events_on_equal_the_protocol_block_hashes(hash_calls: list[int]) -> None:
    cache = make_cache(events=True)
    put(cache, A)
    put(cache, B)
    assert hash_calls  # hashed, once per new leaf
    expected = set(block_hashes(A, PAGE)) | set(block_hashes(B, PAGE))
    assert set(cache.cached_page_hashes()) == expected
    first_leaf = cache.match_prefix(A).last_node
    assert [digest_to_int64(d) for d in first_leaf.page_digests] == block_hashes(A, PAGE)[2:]
