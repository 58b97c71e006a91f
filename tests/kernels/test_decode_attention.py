"""Paged decode attention (split-K + combine, GQA-grouped) against its PyTorch reference."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.decode_attention import decode_attention
from radixserve.kernels.reference import decode_attention_ref
from tests.kernels.cases import DEVICES, DTYPES, assert_close, make_pool, paged_kv, poisoned, randn

# (seq_lens, num_heads, num_kv_heads, head_dim): ragged, one-token, GQA groups 1/2/4, MHA.
Case = tuple[list[int], int, int, int]
SHAPES: dict[str, list[Case]] = {
    "cpu": [([1, 37, 70], 4, 2, 16), ([19, 5, 33, 16], 4, 1, 32), ([40], 2, 2, 16)],
    "cuda": [
        ([1, 511, 2048, 17, 1000, 4096, 64, 300], 32, 8, 128),  # Llama-3-8B heads, ragged
        ([1200] * 16, 16, 2, 128),  # GQA group 8
        ([3, 77], 14, 2, 64),  # group 7: not a power of two
    ],
}
SHAPE_IDS = ["ragged-gqa", "ragged-mqa-or-group8", "single-or-odd-group"]


def _run(case: Case, page_size: int, dtype: torch.dtype,
         device: str, gen: torch.Generator, logit_cap: float = 0.0) -> None:  # fmt: skip
    seq_lens, num_heads, num_kv_heads, head_dim = case
    pool = make_pool(seq_lens, page_size, gen, device)
    k_buf = randn(gen, pool.num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
    v_buf = randn(gen, pool.num_slots, num_kv_heads, head_dim, dtype=dtype, device=device)
    kv = paged_kv(pool, seq_lens, (k_buf, v_buf))
    q = randn(gen, len(seq_lens), num_heads, head_dim, dtype=dtype, device=device)
    out = poisoned(len(seq_lens), num_heads, head_dim, dtype=dtype, device=device)
    scale = head_dim**-0.5
    got = decode_attention(q, kv, scale, logit_cap=logit_cap, num_kv_splits=4, out=out)
    assert got is out
    assert_close(out, decode_attention_ref(q, kv, scale, logit_cap=logit_cap), dtype)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("shape", range(3), ids=SHAPE_IDS)
def test_decode_matches_reference(
    device: str, dtype: torch.dtype, page_size: int, shape: int, gen: torch.Generator
) -> None:
    _run(SHAPES[device][shape], page_size, dtype, device, gen)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_soft_cap(device: str, gen: torch.Generator) -> None:
    case = ([5, 50], 4, 2, 16) if device == "cpu" else ([100, 3000], 32, 8, 128)
    _run(case, 16, torch.float32, device, gen, logit_cap=2.0)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("num_kv_splits", [1, 3, 8])
def test_decode_split_count_does_not_change_the_result(
    device: str, num_kv_splits: int, gen: torch.Generator
) -> None:
    """More splits than tokens leaves empty splits, which the combine stage must skip."""
    seq_lens = [2, 9, 30]
    pool = make_pool(seq_lens, 1, gen, device)
    k_buf = randn(gen, pool.num_slots, 2, 16, dtype=torch.float32, device=device)
    v_buf = randn(gen, pool.num_slots, 2, 16, dtype=torch.float32, device=device)
    kv = paged_kv(pool, seq_lens, (k_buf, v_buf))
    q = randn(gen, 3, 4, 16, dtype=torch.float32, device=device)
    got = decode_attention(q, kv, 0.25, num_kv_splits=num_kv_splits)
    assert_close(got, decode_attention_ref(q, kv, 0.25), torch.float32)


def test_decode_rejects_heads_not_a_multiple_of_kv_heads() -> None:
    q = torch.zeros(1, 3, 16)
    kv = paged_kv(make_pool([4], 1, torch.Generator(), "cpu"), [4], (torch.zeros(9, 2, 16),) * 2)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        decode_attention(q, kv, 1.0)


@pytest.mark.parametrize("device", DEVICES)
def test_decode_absorbed_mla_values_are_a_view_of_the_keys(
    device: str, gen: torch.Generator
) -> None:
    """Absorbed MLA: one KV head of latent rows (kv_lora_rank 32 + rope 16 here; 512 + 64 at
    DeepSeek's shapes), the value its first 32 columns as a strided view, 8 query heads."""
    seq_lens = [1, 23, 40]
    pool = make_pool(seq_lens, 16, gen, device)
    latent = randn(gen, pool.num_slots, 1, 48, dtype=torch.float32, device=device)
    kv = paged_kv(pool, seq_lens, (latent, latent[..., :32]))
    q = randn(gen, 3, 8, 48, dtype=torch.float32, device=device)
    got = decode_attention(q, kv, 0.125, num_kv_splits=4)
    assert got.shape == (3, 8, 32)
    assert_close(got, decode_attention_ref(q, kv, 0.125), torch.float32)
