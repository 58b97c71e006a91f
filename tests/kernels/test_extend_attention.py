"""Extend attention (prefix through kv indices + causal new tokens) against its reference."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.decode_attention import decode_attention
from radixserve.kernels.extend_attention import extend_attention
from radixserve.kernels.kv_store import store_kv
from radixserve.kernels.layout import PagedKv, RaggedKv
from radixserve.kernels.reference import extend_attention_ref
from tests.kernels.cases import DEVICES, DTYPES, assert_close, make_pool, paged_kv, poisoned, randn

# (prefix_lens, extend_lens, num_heads, num_kv_heads, head_dim)
Case = tuple[list[int], list[int], int, int, int]
SHAPES: dict[str, list[Case]] = {
    "cpu": [
        ([0, 20, 33], [5, 1, 40], 4, 2, 16),  # no prefix, one new token, > one block
        ([17, 0], [16, 17], 2, 1, 32),  # block-edge lengths, MQA
    ],
    "cuda": [
        ([0, 1000, 3000, 64], [512, 1, 700, 129], 32, 8, 128),
        ([2048] * 4, [256] * 4, 16, 2, 128),
    ],
}


def _extend_inputs(case: Case, page_size: int, dtype: torch.dtype, device: str,
                   gen: torch.Generator) -> tuple[torch.Tensor, RaggedKv, PagedKv]:  # fmt: skip
    prefix_lens, ext_lens, num_heads, num_kv_heads, head_dim = case
    lens = [p + e for p, e in zip(prefix_lens, ext_lens, strict=True)]
    pool = make_pool(lens, page_size, gen, device)
    k_buf = randn(gen, pool.num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_buf = randn(gen, pool.num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
    prefix = paged_kv(pool, prefix_lens, (k_buf, v_buf))
    num_new = sum(ext_lens)
    qo_indptr = torch.tensor([0, *ext_lens], device=device).cumsum(0).to(torch.int32)
    k = randn(gen, num_new, num_kv_heads, head_dim, dtype=dtype, device=device)
    v = randn(gen, num_new, num_kv_heads, head_dim, dtype=dtype, device=device)
    q = randn(gen, num_new, num_heads, head_dim, dtype=dtype, device=device)
    return q, RaggedKv(k, v, qo_indptr, max(ext_lens)), prefix


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shape", range(2), ids=["ragged-gqa", "block-edges-mqa"])
def test_extend_matches_reference(
    device: str, dtype: torch.dtype, page_size: int, shape: int, gen: torch.Generator
) -> None:
    q, new, prefix = _extend_inputs(SHAPES[device][shape], page_size, dtype, device, gen)
    out = poisoned(*q.shape, dtype=dtype, device=device)
    scale = q.shape[-1] ** -0.5
    assert extend_attention(q, new, prefix, scale, out=out) is out
    assert_close(out, extend_attention_ref(q, new, prefix, scale), dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_extend_soft_cap(device: str, gen: torch.Generator) -> None:
    q, new, prefix = _extend_inputs(SHAPES[device][0], 16, torch.float32, device, gen)
    got = extend_attention(q, new, prefix, 0.25, logit_cap=3.0)
    assert_close(got, extend_attention_ref(q, new, prefix, 0.25, logit_cap=3.0), torch.float32)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("page_size", [1, 16])
def test_extend_then_decode_agree_after_the_kv_store(
    device: str, page_size: int, gen: torch.Generator
) -> None:
    """Storing the new tokens and decoding the last one gives the extend's last row."""
    prefix_lens, ext_lens = [7, 0, 30], [4, 9, 1]
    lens = [p + e for p, e in zip(prefix_lens, ext_lens, strict=True)]
    pool = make_pool(lens, page_size, gen, device)
    k_buf = randn(gen, pool.num_slots, 2, 16, dtype=torch.float32, device=device)
    v_buf = randn(gen, pool.num_slots, 2, 16, dtype=torch.float32, device=device)
    prefix = paged_kv(pool, prefix_lens, (k_buf, v_buf))
    full = paged_kv(pool, lens, (k_buf, v_buf))
    starts = full.kv_indptr.tolist()
    new_slots = [full.kv_indices[starts[i] + p : starts[i + 1]] for i, p in enumerate(prefix_lens)]
    out_cache_loc = torch.cat(new_slots)
    qo_indptr = torch.tensor([0, *ext_lens], device=device).cumsum(0).to(torch.int32)
    k, v, q = (
        randn(gen, sum(ext_lens), h, 16, dtype=torch.float32, device=device) for h in (2, 2, 4)
    )
    ext = extend_attention(q, RaggedKv(k, v, qo_indptr, max(ext_lens)), prefix, 0.25)
    store_kv(k_buf, v_buf, out_cache_loc, k, v)
    last = (qo_indptr[1:] - 1).long()
    assert_close(decode_attention(q[last], full, 0.25), ext[last], torch.float32)
