"""The C++ paged attention kernel (kernels/cpu/paged_attention.cpp) against PyTorch's SDPA in
float32 on the same K/V.

The oracle is `scaled_dot_product_attention` (with `enable_gqa`) over each row's keys,
gathered from the pool by its slots and upcast to float32. The plain entry runs on every CPU
with a compiler, so its tests skip only without g++: rows of several requests sharing a slot
row (an extend's causal rows), strided query rows, the AVX-512 layouts (head dim 64/128 with
1/2/3/4/8 query heads per KV head) and the portable loop (other head dims and group sizes).
The shared-prefix entry (AMX tiles) skips only where the CPU has no AMX-BF16; where it has, a
kernel that does not build, or builds without that entry, fails (`tests/kernels/amx.py`).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels.cpu.build import build_library
from radixserve.kernels.cpu.paged_attention import (
    PAGED_UNSUPPORTED_DTYPE,
    SHARED_BLOCK,
    SHARED_PREFIX_MISMATCH,
    SHARED_UNSUPPORTED,
    SOURCE,
    STORE_SLOT_OUT_OF_RANGE,
    PagedAttentionKernel,
    build_paged_attention,
)
from tests.kernels.amx import skip_without_amx

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler")

# bf16 outputs of magnitude ≤ ~2 (half a step: 2^-8) plus, on the AMX path, the probabilities
# rounded to bf16 for p·v
BF16_ATOL = 8e-3
F32_TOL = 2e-5  # float32: summation order and the vectorised exp


@pytest.fixture(scope="module")
def kernel() -> PagedAttentionKernel:
    return build_paged_attention()


@pytest.fixture(scope="module")
def amx_kernel(kernel: PagedAttentionKernel) -> PagedAttentionKernel:
    """The kernel, with its AMX shared-prefix entry."""
    skip_without_amx()
    assert kernel.has_shared, "built without the AMX entry"
    return kernel


def reference(q, k, v, slots, kv_row, kv_len, scale):  # type: ignore[no-untyped-def]
    """Row r: SDPA of q[r] over slots[kv_row[r], :kv_len[r]] of k/v, in float32."""
    out = torch.empty(q.shape)
    for r in range(q.shape[0]):
        rows = slots[kv_row[r], : kv_len[r]]
        ks, vs = (x[rows].float().transpose(0, 1).unsqueeze(0) for x in (k, v))
        qr = q[r].float().unsqueeze(0).unsqueeze(2)  # [1, Hq, 1, D]
        got = F.scaled_dot_product_attention(qr, ks, vs, scale=scale, enable_gqa=True)
        out[r] = got[0, :, 0]
    return out


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=F32_TOL, rtol=F32_TOL)
    else:
        torch.testing.assert_close(got.float(), want, atol=BF16_ATOL, rtol=0)


def make_case(rows: int, prefix: int, hq: int, hkv: int, d: int, own_max: int, seed: int):  # type: ignore[no-untyped-def]
    """rows rows whose slots start with the same `prefix` slots, then up to own_max of their
    own; q rows strided (as from the qkv projection), bf16."""
    gen = torch.Generator().manual_seed(seed)
    width = prefix + own_max + 1
    pool = prefix + rows * width + 1
    k = torch.randn(pool, hkv, d, generator=gen).to(torch.bfloat16)
    # Values around +1 on the prefix and -1 after it: each output is then a visible mix of
    # the two parts, so a mis-weighted merge of the prefix's partial result shows.
    v = torch.randn(pool, hkv, d, generator=gen) * 0.5 - 1.0
    v[1 : prefix + 1] += 2.0
    v = v.to(torch.bfloat16)
    slots = torch.zeros(rows, width, dtype=torch.int64)
    fresh = torch.randperm(pool - prefix - 1, generator=gen) + prefix + 1
    for r in range(rows):
        slots[r, :prefix] = torch.arange(1, prefix + 1)
        slots[r, prefix:] = fresh[r * (width - prefix) : (r + 1) * (width - prefix)]
    lens = prefix + torch.randint(0, own_max + 1, (rows,), generator=gen)
    qkv = torch.randn(rows, hq * d + 2 * hkv * d, generator=gen).to(torch.bfloat16)
    q = qkv[:, : hq * d].view(rows, hq, d)
    return q, k, v, slots, lens


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize(
    ("hq", "hkv", "d"), [(9, 3, 64), (8, 1, 64), (8, 2, 128), (6, 1, 64), (10, 2, 80), (4, 4, 32)]
)
def test_plain_entry_matches_sdpa(
    kernel: PagedAttentionKernel, dtype: torch.dtype, hq: int, hkv: int, d: int
) -> None:
    """Three decode rows and a 5-token extend of a fourth request (rows 3..7: one slot row,
    causal lengths); lengths around the 16-key blocks of the AVX-512 scores."""
    _, k, v, slots, _ = make_case(4, 0, hq, hkv, d, own_max=70, seed=hq * d + hkv)
    k, v = k.to(dtype), v.to(dtype)
    qkv = torch.randn(8, hq * d + 5, generator=torch.Generator().manual_seed(d)).to(dtype)
    q = qkv[:, : hq * d].view(8, hq, d)  # strided rows
    kv_row = torch.tensor([0, 1, 2, 3, 3, 3, 3, 3])
    kv_len = torch.tensor([1, 16, 33, 60, 61, 62, 63, 64])
    assert PagedAttentionKernel.supports(q, k, slots)
    got = kernel(q, k, v, slots, kv_row, kv_len, d**-0.5)
    assert got.dtype == dtype
    assert_matches(got, reference(q, k, v, slots, kv_row, kv_len, d**-0.5))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_kv_store_matches_indexed_assignment(
    kernel: PagedAttentionKernel, dtype: torch.dtype
) -> None:
    """The KV write (rows of a fused qkv output to pool slots) against torch's indexed
    assignment; a slot outside the pool is an error and writes nothing."""
    hkv, d = 3, 64
    qkv = torch.randn(7, 9 * d + 2 * hkv * d, generator=torch.Generator().manual_seed(3))
    _, k, v = qkv.to(dtype).split([9 * d, hkv * d, hkv * d], dim=-1)
    loc = torch.tensor([5, 1, 17, 2, 30, 9, 8])
    caches = [torch.zeros(32, hkv, d, dtype=dtype) for _ in range(4)]
    assert kernel.store(k, v, caches[0], caches[1], loc)
    caches[2][loc], caches[3][loc] = k.view(7, hkv, d), v.view(7, hkv, d)
    assert torch.equal(caches[0], caches[2]) and torch.equal(caches[1], caches[3])
    before = caches[0].clone()
    with pytest.raises(IndexError, match="outside the pool"):
        kernel.store(k, v, caches[0], caches[1], torch.tensor([0, 1, 2, 3, 4, 5, 32]))
    assert torch.equal(caches[0], before)
    # not the layout it copies (a non-int64 loc): False, nothing written
    assert not kernel.store(k, v, caches[0], caches[1], loc.to(torch.int32))


def test_error_codes_are_the_entries(kernel: PagedAttentionKernel) -> None:
    """The named codes are what the library returns, for inputs each entry refuses before
    it reads a tensor: a dtype code outside DTYPE_CODES, float32 to the shared entry, a slot
    outside the pool."""
    lib, shape = kernel.lib, [0] * 7  # nrows, hq, hkv, d and the strides
    assert lib.radixserve_paged_attention(2, *[None] * 7, *shape, 1.0, 1) == PAGED_UNSUPPORTED_DTYPE
    shared_tail = [None, SHARED_BLOCK, None, 0]
    rc = lib.radixserve_paged_attention_shared(0, *[None] * 7, *shape, 1.0, 1, *shared_tail)
    assert rc == SHARED_UNSUPPORTED
    loc = torch.tensor([-1])
    rc = lib.radixserve_store_kv(2, *[None] * 2, 0, 0, *[None] * 2, 0, 4, loc.data_ptr(), 1, 0, 1)
    assert rc == STORE_SLOT_OUT_OF_RANGE


def test_the_library_builds_into_an_empty_cache_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A fresh machine: the cache folder is created, the library built once, then reused."""
    monkeypatch.setenv("RADIXSERVE_KERNEL_CACHE", str(tmp_path / "kernels"))
    first = build_library(SOURCE)
    assert first.parent == tmp_path / "kernels" and first.name.startswith("paged_attention-")
    built_at = first.stat().st_mtime_ns
    assert build_library(SOURCE) == first and first.stat().st_mtime_ns == built_at


@pytest.mark.parametrize(
    ("hq", "hkv", "d"), [(9, 3, 64), (4, 4, 64), (8, 4, 64), (8, 1, 64), (8, 2, 128), (4, 1, 128)]
)
@pytest.mark.parametrize("members", ["all", "some"])
def test_shared_prefix_matches_sdpa(
    amx_kernel: PagedAttentionKernel, hq: int, hkv: int, d: int, members: str
) -> None:
    """Members any subset of the rows (the others go through the plain path in the same
    call), own keys after the prefix none or a few."""
    rows, prefix = 11, 3 * SHARED_BLOCK
    q, k, v, slots, lens = make_case(rows, prefix, hq, hkv, d, own_max=120, seed=hq * d + hkv)
    lens[0] = prefix  # a member with no keys of its own after the prefix
    picked = torch.arange(rows) if members == "all" else torch.tensor([0, 2, 3, 5, 8, 10])
    scale = d**-0.5
    kv_row = torch.arange(rows)
    got = amx_kernel.shared(q, k, v, slots, kv_row, lens, scale, slots[0, :prefix].clone(), picked)
    assert got is not None
    assert_matches(got, reference(q, k, v, slots, kv_row, lens, scale))
    # and the plain kernel gives the same answer to bf16 rounding
    plain = amx_kernel(q, k, v, slots, kv_row, lens, scale)
    torch.testing.assert_close(got.float(), plain.float(), atol=BF16_ATOL, rtol=0)


def test_a_member_that_does_not_share_the_prefix_is_an_error(
    amx_kernel: PagedAttentionKernel,
) -> None:
    q, k, v, slots, lens = make_case(6, 2 * SHARED_BLOCK, 9, 3, 64, own_max=8, seed=1)
    slots[4, 7] = slots[4, -1]  # row 4's prefix differs in one slot
    rows, prefix = torch.arange(6), slots[0, :64].clone()
    with pytest.raises(RuntimeError, match=rf"shared prefix\) failed \({SHARED_PREFIX_MISMATCH}\)"):
        amx_kernel.shared(q, k, v, slots, rows, lens, 0.125, prefix, rows)


def test_unsupported_layouts_fall_back(amx_kernel: PagedAttentionKernel) -> None:
    """float32, or a prefix that is not whole blocks: None (the caller runs the plain path)."""
    q, k, v, slots, lens = make_case(4, 2 * SHARED_BLOCK, 9, 3, 64, own_max=4, seed=2)
    rows, prefix = torch.arange(4), slots[0, :64].clone()
    qf, kf, vf = q.float(), k.float(), v.float()
    assert amx_kernel.shared(qf, kf, vf, slots, rows, lens, 0.1, prefix, rows) is None
    assert amx_kernel.shared(q, k, v, slots, rows, lens, 0.1, prefix[:40].clone(), rows) is None
