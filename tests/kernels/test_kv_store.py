"""The KV store kernel and the kv-index builders (req_to_token -> kv_indptr / kv_indices)."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.kv_index import fill_kv_indices
from radixserve.kernels.kv_store import store_kv
from radixserve.kernels.layout import build_kv_indices
from radixserve.kernels.reference import store_kv_ref
from tests.kernels.cases import DEVICES, DTYPES, INTERPRETED, make_pool, randn


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_store_kv_writes_exactly_the_named_slots(
    device: str, dtype: torch.dtype, page_size: int, gen: torch.Generator
) -> None:
    lens = [3, 17, 1] if device == "cpu" else [1000, 1, 4096, 33]
    heads, head_dim = (2, 16) if device == "cpu" else (8, 128)
    pool = make_pool(lens, page_size, gen, device)
    rows = pool.req_pool_indices.tolist()
    loc = torch.cat([pool.req_to_token[r, :n] for r, n in zip(rows, lens, strict=True)])
    k_buf = randn(gen, pool.num_slots, heads, head_dim, dtype=dtype, device=device)
    v_buf = randn(gen, pool.num_slots, heads, head_dim, dtype=dtype, device=device)
    k = randn(gen, loc.numel(), heads, head_dim, dtype=dtype, device=device)
    v = randn(gen, loc.numel(), heads, head_dim, dtype=dtype, device=device)
    want_k, want_v = k_buf.clone(), v_buf.clone()
    store_kv_ref(want_k, want_v, loc, k, v)
    store_kv(k_buf, v_buf, loc.to(torch.int64), k, v)
    assert torch.equal(k_buf, want_k) and torch.equal(v_buf, want_v)


@pytest.mark.skipif(not INTERPRETED, reason="needs TRITON_INTERPRET=1")
def test_store_kv_casts_to_the_pool_dtype_with_a_different_v_head_dim(
    gen: torch.Generator,
) -> None:
    k_buf = torch.zeros(10, 2, 16, dtype=torch.float16)
    v_buf = torch.zeros(10, 2, 8, dtype=torch.float16)
    k, v = torch.randn(3, 2, 16, generator=gen), torch.randn(3, 2, 8, generator=gen)
    loc = torch.tensor([7, 2, 5], dtype=torch.int32)
    store_kv(k_buf, v_buf, loc, k, v)
    assert torch.equal(k_buf[loc.long()], k.half()) and torch.equal(v_buf[loc.long()], v.half())
    untouched = torch.ones(10, dtype=torch.bool)
    untouched[loc.long()] = False
    assert not k_buf[untouched].any() and not v_buf[untouched].any()


@pytest.mark.parametrize("page_size", [1, 16])
def test_build_kv_indices_flattens_each_requests_rows(page_size: int, gen: torch.Generator) -> None:
    lens = [5, 0, 33, 16]
    pool = make_pool(lens, page_size, gen, "cpu")
    indptr, indices = build_kv_indices(
        pool.req_to_token, pool.req_pool_indices, torch.tensor(lens, dtype=torch.int32)
    )
    assert indptr.tolist() == [0, 5, 5, 38, 54] and indptr.dtype == torch.int32
    for i, (row, n) in enumerate(zip(pool.req_pool_indices.tolist(), lens, strict=True)):
        assert indices[indptr[i] : indptr[i + 1]].tolist() == pool.req_to_token[row, :n].tolist()
    if page_size == 16:  # page-aligned runs: every request's slots start on a page boundary
        assert all(int(indices[s]) % 16 == 0 for s in (0, 5, 38))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_fill_kv_indices_matches_the_host_builder(
    device: str, page_size: int, gen: torch.Generator
) -> None:
    lens = [5, 0, 33, 16] if device == "cpu" else [4096, 0, 1, 2000, 77]
    pool = make_pool(lens, page_size, gen, device)
    seq_lens = torch.tensor(lens, dtype=torch.int64, device=device)
    want = build_kv_indices(pool.req_to_token, pool.req_pool_indices, seq_lens)
    buffer = torch.full((sum(lens) + 7,), -1, dtype=torch.int32, device=device)  # graph-sized
    got = fill_kv_indices(pool.req_to_token, pool.req_pool_indices, seq_lens, buffer)
    assert got.kv_indices is buffer
    assert torch.equal(got.kv_indptr, want.kv_indptr)
    assert torch.equal(buffer[: sum(lens)], want.kv_indices)
    assert (buffer[sum(lens) :] == -1).all(), "past the end stays untouched"
    exact = fill_kv_indices(pool.req_to_token, pool.req_pool_indices, seq_lens)
    assert torch.equal(exact.kv_indices, want.kv_indices)
