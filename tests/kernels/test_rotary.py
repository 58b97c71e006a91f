"""Neox-style rotary embedding against its reference: out of place, in place, partial rotary."""

from __future__ import annotations

import pytest
import torch

from radixserve.kernels.reference import rotary_ref
from radixserve.kernels.rotary import rotary
from tests.kernels.cases import DEVICES, DTYPES, assert_close, poisoned, randn

# (num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim, max_pos)
SHAPES = {
    "cpu": [(5, 4, 2, 16, 16, 64), (3, 3, 1, 32, 16, 40)],
    "cuda": [(512, 32, 8, 128, 128, 8192), (100, 14, 2, 64, 64, 32768)],
}


def cos_sin_cache(max_pos: int, rotary_dim: int, base: float, device: str) -> torch.Tensor:
    """[max_pos, rotary_dim] fp32 rows [cos | sin] of position * base^(-2i / rotary_dim)."""
    inv_freq = base ** (-torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    freqs = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv_freq[None, :]
    return torch.cat([freqs.cos(), freqs.sin()], dim=-1).float().to(device)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [0, 1], ids=["full-rotary", "partial-rotary-or-qwen"])
def test_rotary_matches_reference(
    device: str, dtype: torch.dtype, shape: int, gen: torch.Generator
) -> None:
    num_tokens, num_heads, num_kv_heads, head_dim, rotary_dim, max_pos = SHAPES[device][shape]
    positions = torch.randint(0, max_pos, (num_tokens,), generator=gen).to(device)
    cache = cos_sin_cache(max_pos, rotary_dim, 10000.0, device)
    q = randn(gen, num_tokens, num_heads, head_dim, dtype=dtype, device=device)
    k = randn(gen, num_tokens, num_kv_heads, head_dim, dtype=dtype, device=device)
    out_q = poisoned(*q.shape, dtype=dtype, device=device)
    out_k = poisoned(*k.shape, dtype=dtype, device=device)
    got = rotary(positions, q, k, cache, out_q, out_k)
    want = rotary_ref(positions, q, k, cache)
    assert got.q is out_q and got.k is out_k
    assert_close(got.q, want.q, dtype)
    assert_close(got.k, want.k, dtype)


@pytest.mark.parametrize("device", DEVICES)
def test_rotary_in_place(device: str, gen: torch.Generator) -> None:
    positions = torch.tensor([0, 7, 3, 63], device=device)
    cache = cos_sin_cache(64, 16, 500000.0, device)
    q = randn(gen, 4, 4, 16, dtype=torch.float32, device=device)
    k = randn(gen, 4, 1, 16, dtype=torch.float32, device=device)
    want = rotary_ref(positions, q, k, cache)
    got = rotary(positions, q, k, cache, out_q=q, out_k=k)
    assert got.q is q and got.k is k
    assert_close(q, want.q, torch.float32)
    assert_close(k, want.k, torch.float32)
