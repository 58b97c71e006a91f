"""The C++ MLA decode kernel (kernels/cpu/mla_decode.cpp) against PyTorch's SDPA in float32 on
the same latent rows: one KV head of width d whose first dv columns are the values, every query
head attending it. Shapes: DeepSeek's real latent (576 / 512) and a tiny one; head counts below,
at and above the kernel's head block, not multiples of it; rows sharing a slot row (an extend's
causal rows); query rows strided as views of a wider tensor; float32 and bfloat16. A row's result
does not depend on the other rows of the call (bitwise), and bad shapes are refused."""

from __future__ import annotations

import shutil

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels.cpu.mla_decode import MlaDecodeKernel, build_mla_decode

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")

BF16_ATOL = 8e-3  # bf16 outputs of magnitude ≤ ~2: half a step, plus the inputs' rounding
F32_TOL = 2e-5  # float32: summation order and the vectorised exp


@pytest.fixture(scope="module")
def kernel() -> MlaDecodeKernel:
    return build_mla_decode()


def reference(q, kv, dv, slots, kv_row, kv_len, scale):  # type: ignore[no-untyped-def]
    """Row r: SDPA of q[r] over the latent rows slots[kv_row[r], :kv_len[r]], in float32."""
    out = torch.empty(q.shape[0], q.shape[1], dv)
    for r in range(q.shape[0]):
        rows = kv[slots[kv_row[r], : kv_len[r]], 0].float()  # [L, d]
        k, v = rows[None, None], rows[None, None, :, :dv]
        qr = q[r].float()[None, :, None]  # [1, H, 1, d]
        got = F.scaled_dot_product_attention(qr, k, v, scale=scale, enable_gqa=True)
        out[r] = got[0, :, 0]
    return out


def make_case(rows: int, heads: int, d: int, max_len: int, dtype: torch.dtype, seed: int):  # type: ignore[no-untyped-def]
    gen = torch.Generator().manual_seed(seed)
    pool = rows * max_len + 1
    kv = torch.randn(pool, 1, d, generator=gen).to(dtype)
    q = torch.randn(rows, heads, d, generator=gen).to(dtype)
    perm = torch.randperm(pool - 1, generator=gen) + 1  # scattered slots, never slot 0
    slots = perm[: rows * max_len].view(rows, max_len).contiguous()
    kv_len = torch.randint(1, max_len + 1, (rows,), generator=gen)
    kv_row = torch.arange(rows)
    return q, kv, slots, kv_row, kv_len


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("heads", "d", "dv"), [(16, 576, 512), (5, 48, 32), (40, 48, 32)])
def test_matches_sdpa(
    kernel: MlaDecodeKernel, dtype: torch.dtype, heads: int, d: int, dv: int
) -> None:
    q, kv, slots, kv_row, kv_len = make_case(6, heads, d, 70, dtype, seed=heads + d)
    scale = 0.1
    assert MlaDecodeKernel.supports(q, kv, slots)
    got = kernel(q, kv, dv, slots, kv_row, kv_len, scale)
    want = reference(q, kv, dv, slots, kv_row, kv_len, scale)
    if dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=F32_TOL, rtol=F32_TOL)
    else:
        torch.testing.assert_close(got.float(), want, atol=BF16_ATOL, rtol=0)


def test_strided_rows_and_shared_slot_rows(kernel: MlaDecodeKernel) -> None:
    """Query rows that are every other row of a wider tensor, and an extend's causal rows:
    three rows reading the same slot row at lengths 4, 5, 6."""
    gen = torch.Generator().manual_seed(3)
    heads, d, dv = 4, 48, 32
    kv = torch.randn(20, 1, d, generator=gen)
    big = torch.randn(6, heads * d, generator=gen)
    q = big[::2].view(3, heads, d)  # q_stride 2 · heads · d
    slots = torch.tensor([[5, 9, 2, 11, 7, 3, 14]])
    kv_row, kv_len = torch.zeros(3, dtype=torch.int64), torch.tensor([4, 5, 6])
    assert MlaDecodeKernel.supports(q, kv, slots)
    got = kernel(q, kv, dv, slots, kv_row, kv_len, 0.2)
    want = reference(q, kv, dv, slots, kv_row, kv_len, 0.2)
    torch.testing.assert_close(got, want, atol=F32_TOL, rtol=F32_TOL)


def test_a_row_does_not_depend_on_its_batch(kernel: MlaDecodeKernel) -> None:
    q, kv, slots, kv_row, kv_len = make_case(5, 16, 576, 40, torch.bfloat16, seed=8)
    batch = kernel(q, kv, 512, slots, kv_row, kv_len, 0.05)
    for r in range(5):
        alone = kernel(q[r : r + 1], kv, 512, slots, kv_row[r : r + 1], kv_len[r : r + 1], 0.05)
        assert torch.equal(alone[0], batch[r])


def test_bad_shapes_are_refused(kernel: MlaDecodeKernel) -> None:
    q, kv, slots, kv_row, kv_len = make_case(2, 4, 48, 8, torch.float32, seed=1)
    with pytest.raises(ValueError, match="v_dim"):
        kernel(q, kv, 49, slots, kv_row, kv_len, 0.1)
    with pytest.raises(ValueError, match="no keys"):
        kernel(q, kv, 32, slots, kv_row, torch.tensor([0, 3]), 0.1)
    assert not MlaDecodeKernel.supports(q.to(torch.bfloat16), kv, slots)  # mixed dtypes
    assert not MlaDecodeKernel.supports(q, kv.expand(-1, 2, -1), slots)  # two KV heads
