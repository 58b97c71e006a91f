"""Tests for ReqToTokenPool (rows of KV slot indices) and MHATokenToKVPool (per-layer K/V)."""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool

CPU = torch.device("cpu")


# ---- ReqToTokenPool ------------------------------------------------------------------------


def test_req_pool_table_shape_and_dtype() -> None:
    pool = ReqToTokenPool(4, 32, CPU)
    assert pool.req_to_token.shape == (4, 32)
    assert pool.req_to_token.dtype == torch.int32
    assert pool.available_size() == 4


def test_req_pool_alloc_exactly_all_rows() -> None:
    pool = ReqToTokenPool(4, 8, CPU)
    rows = pool.alloc(4)
    assert rows is not None and sorted(rows) == [0, 1, 2, 3]
    assert pool.available_size() == 0


def test_req_pool_alloc_one_more_than_free_returns_none_and_takes_nothing() -> None:
    pool = ReqToTokenPool(4, 8, CPU)
    assert pool.alloc(1) is not None
    assert pool.alloc(4) is None
    assert pool.available_size() == 3
    assert pool.alloc(3) is not None


def test_req_pool_rows_are_distinct_across_calls() -> None:
    pool = ReqToTokenPool(5, 8, CPU)
    a, b = pool.alloc(2), pool.alloc(3)
    assert a is not None and b is not None
    assert len(set(a) | set(b)) == 5


def test_req_pool_free_then_realloc_returns_the_row() -> None:
    pool = ReqToTokenPool(3, 8, CPU)
    rows = pool.alloc(3)
    assert rows is not None
    pool.free(rows[1])
    assert pool.available_size() == 1
    assert pool.alloc(1) == [rows[1]]
    assert pool.alloc(1) is None


def test_req_pool_write_fills_exactly_the_range() -> None:
    pool = ReqToTokenPool(2, 10, CPU)
    pool.write(1, 3, torch.tensor([7, 8, 9], dtype=torch.int64))
    assert pool.req_to_token[1].tolist() == [0, 0, 0, 7, 8, 9, 0, 0, 0, 0]
    assert pool.req_to_token[0].tolist() == [0] * 10
    assert pool.req_to_token.dtype == torch.int32


def test_req_pool_write_up_to_last_column() -> None:
    pool = ReqToTokenPool(1, 6, CPU)
    pool.write(0, 4, torch.tensor([5, 6]))
    assert pool.req_to_token[0, 4:].tolist() == [5, 6]


def test_req_pool_write_empty_is_noop() -> None:
    pool = ReqToTokenPool(1, 4, CPU)
    pool.write(0, 2, torch.empty(0, dtype=torch.int64))
    assert pool.req_to_token[0].tolist() == [0, 0, 0, 0]


def test_req_pool_clear_frees_every_row() -> None:
    pool = ReqToTokenPool(3, 4, CPU)
    pool.alloc(3)
    pool.clear()
    assert pool.available_size() == 3


# ---- MHATokenToKVPool ----------------------------------------------------------------------


def _kv(size: int = 16, page: int = 4, dtype: torch.dtype = torch.float32) -> MHATokenToKVPool:
    return MHATokenToKVPool(size, page, dtype, num_kv_heads=2, head_dim=8, num_layers=3, device=CPU)


@pytest.mark.parametrize("page", [1, 4, 16])
def test_kv_pool_buffer_shape_is_size_plus_page(page: int) -> None:
    pool = _kv(size=32, page=page)
    assert len(pool.k_buffer) == len(pool.v_buffer) == 3
    for buf in (*pool.k_buffer, *pool.v_buffer):
        assert buf.shape == (32 + page, 2, 8)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_kv_pool_buffer_dtype(dtype: torch.dtype) -> None:
    pool = _kv(dtype=dtype)
    assert all(b.dtype == dtype for b in (*pool.k_buffer, *pool.v_buffer))


def test_kv_pool_layers_have_separate_storage() -> None:
    pool = _kv()
    ptrs = {b.data_ptr() for b in (*pool.k_buffer, *pool.v_buffer)}
    assert len(ptrs) == 6


@pytest.mark.parametrize("page", [1, 4, 16])
def test_kv_pool_holds_every_slot_the_allocator_hands_out(page: int) -> None:
    size = page * 8
    alloc = create_allocator(size, page, CPU)
    slots = alloc.alloc_extend([0], [size], [-1])
    assert slots is not None
    assert int(slots.max()) == _kv(size=size, page=page).k_buffer[0].shape[0] - 1


def test_cell_size_float32() -> None:
    # SmolLM2-135M: 3 KV heads × 64 dims × 30 layers × K+V × 4 bytes
    assert MHATokenToKVPool.cell_size_bytes(3, 64, 30, torch.float32) == 46080


def test_cell_size_bfloat16() -> None:
    assert MHATokenToKVPool.cell_size_bytes(3, 64, 30, torch.bfloat16) == 23040


def test_cell_size_counts_k_and_v() -> None:
    assert MHATokenToKVPool.cell_size_bytes(1, 1, 1, torch.float32) == 8


def test_cell_size_matches_allocated_bytes_per_slot() -> None:
    pool = _kv(size=16, page=4, dtype=torch.bfloat16)
    total = sum(b.numel() * b.element_size() for b in (*pool.k_buffer, *pool.v_buffer))
    assert total == (16 + 4) * MHATokenToKVPool.cell_size_bytes(2, 8, 3, torch.bfloat16)


def test_set_then_get_round_trips_the_rows() -> None:
    pool = _kv()
    loc = torch.tensor([1, 5, 19])  # 19 == size + page − 1, the last row
    k = torch.randn(3, 2, 8)
    v = torch.randn(3, 2, 8)
    pool.set_kv_buffer(1, loc, k, v)
    kb, vb = pool.get_kv_buffer(1)
    assert torch.equal(kb[loc], k) and torch.equal(vb[loc], v)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-for-bit equality: unwritten memory may hold NaN patterns, which never equal."""
    return torch.equal(a.view(torch.int32), b.view(torch.int32))


def test_set_leaves_other_rows_and_layers_untouched() -> None:
    pool = _kv()
    # the pool's unwritten slots hold whatever memory held: compare with a snapshot
    before = [tuple(t.clone() for t in pool.get_kv_buffer(layer)) for layer in range(3)]
    loc = torch.tensor([2, 3])
    pool.set_kv_buffer(0, loc, torch.ones(2, 2, 8), torch.full((2, 2, 8), 2.0))
    kb, vb = pool.get_kv_buffer(0)
    mask = torch.ones(20, dtype=torch.bool)
    mask[loc] = False
    assert _same_bits(kb[mask], before[0][0][mask]) and _same_bits(vb[mask], before[0][1][mask])
    for layer in (1, 2):
        k1, v1 = pool.get_kv_buffer(layer)
        assert _same_bits(k1, before[layer][0]) and _same_bits(v1, before[layer][1])


def test_the_reserved_padding_page_is_zero() -> None:
    """Slot 0 (page 0) is where padding rows point: it must read as zeros (finite K/V whose
    masked-out scores carry no weight), whatever the rest of the memory held."""
    for page in (1, 4):
        pool = MHATokenToKVPool(16, page, torch.float32, 2, 8, 2, torch.device("cpu"))
        for layer in range(2):
            k, v = pool.get_kv_buffer(layer)
            assert k[:page].abs().sum() == 0 and v[:page].abs().sum() == 0


def test_set_casts_to_pool_dtype() -> None:
    pool = _kv(dtype=torch.bfloat16)
    k = torch.full((1, 2, 8), 1.5, dtype=torch.float32)
    pool.set_kv_buffer(2, torch.tensor([4]), k, -k)
    kb, vb = pool.get_kv_buffer(2)
    assert kb.dtype == torch.bfloat16
    assert kb[4].float().eq(1.5).all() and vb[4].float().eq(-1.5).all()


def test_get_returns_the_live_buffers() -> None:
    pool = _kv()
    kb, vb = pool.get_kv_buffer(0)
    assert kb is pool.k_buffer[0] and vb is pool.v_buffer[0]
