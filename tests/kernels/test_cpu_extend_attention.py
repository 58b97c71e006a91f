"""The tiled extend entry of the C++ paged attention kernel (`flash_extend.h`) against PyTorch's
SDPA in float32 on the same K/V.

The oracle is `scaled_dot_product_attention` (`enable_gqa`) of each request's new queries
over its keys gathered from the pool by its slots and upcast to float32, causal from its
cached prefix on. Cases: several requests in one call with different cached prefixes and
extend lengths (a one-token extend, ragged 16-row tiles, keys across the 48-key tiles), page
sizes 1 and 16 (slots in whole pages of a shuffled pool, as the allocator hands them out),
head layouts from one KV head to MHA and head dims 16 to 128, float32 and bfloat16, and
prompts of up to 8k tokens with and without a cached prefix. A query row's result must be
the same bits wherever its extend starts (one prefill, or chunks over the earlier ones), and
the builds of CPUs without AVX512-BF16 or without AVX-512 take their own paths (float32
tiles; none: the caller keeps SDPA).
"""

from __future__ import annotations

import platform
import shutil
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F

from radixserve.engine.configs.cpu_features import cpu_flags
from radixserve.kernels.cpu.paged_attention import (
    EXTEND_UNSUPPORTED,
    PAGED_UNSUPPORTED_DTYPE,
    ExtendRequests,
    PagedAttentionKernel,
    build_paged_attention,
)

pytestmark = [
    pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler"),
    pytest.mark.skipif("avx512f" not in cpu_flags(), reason="the tiled path needs AVX-512"),
]

# float32: summation order and the vectorised exp. bf16: the output's rounding (half a step
# at magnitudes up to ~3) plus the probabilities rounded to bf16 for p·v.
F32_TOL = 2e-5
BF16_ATOL = 1.2e-2


@pytest.fixture(scope="module")
def kernel() -> PagedAttentionKernel:
    kernel = build_paged_attention()
    assert kernel.has_extend, "an AVX-512 build without the tiled extend"
    return kernel


@dataclass
class Case:
    q: torch.Tensor  # [N, Hq, D], rows strided (a view of a fused qkv row)
    k: torch.Tensor  # [S, Hkv, D] the pool
    v: torch.Tensor
    slots: torch.Tensor  # [B, L] int64
    reqs: ExtendRequests
    scale: float


def make_case(  # noqa: PLR0913 - the shape of a batch
    dtype: torch.dtype,
    heads: tuple[int, int, int],
    prefixes: list[int],
    extends: list[int],
    page_size: int,
    seed: int,
) -> Case:
    """Requests with `prefixes[i]` cached and `extends[i]` new tokens; each request's slots
    are whole pages of `page_size` drawn from a shuffled pool (page 0 reserved)."""
    hq, hkv, d = heads
    gen = torch.Generator().manual_seed(seed)
    totals = [p + e for p, e in zip(prefixes, extends, strict=True)]
    pages_of = [-(-t // page_size) for t in totals]
    pages = torch.randperm(sum(pages_of) + 3, generator=gen)[: sum(pages_of)] + 1
    pool = (sum(pages_of) + 4) * page_size
    slots = torch.zeros(len(totals), max(totals), dtype=torch.int64)
    first = 0
    for r, (t, n) in enumerate(zip(totals, pages_of, strict=True)):
        run = pages[first : first + n, None] * page_size + torch.arange(page_size)
        slots[r, :t] = run.reshape(-1)[:t]
        first += n
    k = torch.randn(pool, hkv, d, generator=gen).to(dtype)
    v = torch.randn(pool, hkv, d, generator=gen).to(dtype)
    rows = sum(extends)
    qkv = torch.randn(rows, (hq + 2 * hkv) * d, generator=gen).to(dtype)
    q = qkv[:, : hq * d].view(rows, hq, d)
    starts = [sum(extends[:i]) for i in range(len(extends))]
    reqs = ExtendRequests.of(list(range(len(extends))), starts, prefixes, extends)
    return Case(q, k, v, slots, reqs, d**-0.5)


def run(kernel: PagedAttentionKernel, c: Case) -> torch.Tensor:
    out = torch.full(c.q.shape, float("nan"), dtype=c.q.dtype)
    assert kernel.extend(c.q, c.k, c.v, c.slots, c.reqs, c.scale, out)
    return out


def reference(c: Case) -> torch.Tensor:
    """Each request's rows by SDPA in float32 over its gathered keys, causal from its prefix."""
    out = torch.empty(c.q.shape)
    for row, start, prefix, ext in zip(
        *(x.tolist() for x in (c.reqs.kv_row, c.reqs.q_start, c.reqs.prefix, c.reqs.extend)),
        strict=True,
    ):
        keys = c.slots[row, : prefix + ext]
        ks, vs = (x[keys].float().transpose(0, 1).unsqueeze(0) for x in (c.k, c.v))
        qs = c.q[start : start + ext].float().transpose(0, 1).unsqueeze(0)
        mask = None
        if prefix:
            mask = torch.ones(ext, prefix + ext, dtype=torch.bool).tril(prefix)
        got = F.scaled_dot_product_attention(
            qs, ks, vs, attn_mask=mask, is_causal=mask is None, scale=c.scale, enable_gqa=True
        )
        out[start : start + ext] = got[0].transpose(0, 1)
    return out


def assert_matches(got: torch.Tensor, want: torch.Tensor) -> None:
    if got.dtype == torch.float32:
        torch.testing.assert_close(got, want, atol=F32_TOL, rtol=F32_TOL)
    else:
        torch.testing.assert_close(got.float(), want, atol=BF16_ATOL, rtol=0)


DTYPES = [torch.float32, torch.bfloat16]
LAYOUTS = [(9, 3, 64), (8, 1, 128), (4, 2, 16), (4, 4, 32), (6, 1, 64), (10, 2, 64)]


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", LAYOUTS, ids=lambda h: f"{h[0]}q{h[1]}kv-d{h[2]}")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_batch_of_extends_matches_sdpa(
    kernel: PagedAttentionKernel, dtype: torch.dtype, heads: tuple[int, int, int], page_size: int
) -> None:
    """Five requests in one call: a prefill, extends over cached prefixes shorter and longer
    than a key tile, a one-token extend, one of exactly a query tile."""
    prefixes, extends = [0, 37, 300, 5, 49], [70, 1, 129, 33, 16]
    c = make_case(dtype, heads, prefixes, extends, page_size, seed=sum(heads) + page_size)
    assert_matches(run(kernel, c), reference(c))


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("cached", [0, 6000], ids=["no-prefix", "prefix6000"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prompts_up_to_8k_tokens_match_sdpa(
    kernel: PagedAttentionKernel, dtype: torch.dtype, cached: int, page_size: int
) -> None:
    """SmolLM2's heads at its longest context: an 8192-token prompt in one prefill, or its
    last 2192 tokens over 6000 cached ones; beside it, in the same call, a shorter request."""
    prefixes, extends = [cached, 0], [8192 - cached, 700]
    c = make_case(dtype, (9, 3, 64), prefixes, extends, page_size, seed=cached + page_size)
    assert_matches(run(kernel, c), reference(c))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_a_row_is_the_same_bits_wherever_its_extend_starts(
    kernel: PagedAttentionKernel, dtype: torch.dtype
) -> None:
    """A 300-token prompt prefilled at once, and in chunks of 100, 77 and 123 (each over the
    earlier ones in the pool, as chunked prefill and the radix cache run it), beside another
    request that changes how the work is split: every row gets the same bits."""
    whole = make_case(dtype, (9, 3, 64), [0, 0], [300, 45], 1, seed=5)
    want = run(kernel, whole)
    start = 0
    for size in (100, 77, 123):
        rows = slice(start, start + size)
        other = slice(300, 345)
        q = torch.cat([whole.q[rows], whole.q[other]])
        reqs = ExtendRequests.of([0, 1], [0, size], [start, 0], [size, 45])
        chunk = Case(q, whole.k, whole.v, whole.slots, reqs, whole.scale)
        got = run(kernel, chunk)
        assert torch.equal(got[:size], want[rows]), f"chunk at {start}"
        assert torch.equal(got[size:], want[other])
        start += size


def test_what_the_path_does_not_take_is_refused(kernel: PagedAttentionKernel) -> None:
    """A head dim it does not compile: False, nothing written (the caller keeps SDPA); a dtype
    code outside DTYPE_CODES: the entry's error."""
    c = make_case(torch.float32, (4, 2, 80), [3], [20], 1, seed=1)
    out = torch.zeros(c.q.shape)
    assert not kernel.extend(c.q, c.k, c.v, c.slots, c.reqs, c.scale, out)
    assert not out.any()
    zeros = [0] * 6  # hq, hkv, d, strides
    rc = kernel.lib.radixserve_extend_attention(2, *[None] * 8, 0, None, *zeros, 1.0, 1)
    assert rc == PAGED_UNSUPPORTED_DTYPE


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 targets")
def test_a_build_without_avx512_bf16_uses_float32_tiles() -> None:
    """AVX-512 without BF16 (Skylake-SP, Cascade Lake): bf16 extends on float32 tiles, same
    oracle."""
    kernel = build_paged_attention(("-march=native", "-mno-avx512bf16"))
    assert kernel.has_extend
    c = make_case(torch.bfloat16, (9, 3, 64), [0, 130], [90, 40], 16, seed=3)
    assert_matches(run(kernel, c), reference(c))


@pytest.mark.skipif(platform.machine() != "x86_64", reason="x86-64 targets")
def test_a_build_without_avx512_has_no_tiled_path() -> None:
    """Baseline x86-64: `has_extend` False, `extend` False, and the entry says unsupported."""
    kernel = build_paged_attention(("-march=x86-64",))
    assert not kernel.has_extend
    c = make_case(torch.float32, (9, 3, 64), [0], [20], 1, seed=2)
    out = torch.zeros(c.q.shape)
    assert not kernel.extend(c.q, c.k, c.v, c.slots, c.reqs, c.scale, out)
    r = c.reqs
    rc = kernel.lib.radixserve_extend_attention(
        0, c.q.data_ptr(), c.k.data_ptr(), c.v.data_ptr(), c.slots.data_ptr(),
        r.kv_row.data_ptr(), r.q_start.data_ptr(), r.prefix.data_ptr(), r.extend.data_ptr(),
        1, out.data_ptr(), 9, 3, 64, c.q.stride(0), c.k.stride(0), c.slots.stride(0),
        c.scale, 1,
    )  # fmt: skip
    assert rc == EXTEND_UNSUPPORTED and not out.any()
