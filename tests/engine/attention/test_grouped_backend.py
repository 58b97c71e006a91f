"""The grouped (CPU default) attention backend against the PyTorch reference backend.

Both run on the same paged KV pool, filled through each backend's own KV write, for extend
(with and without a cached prefix), decode and mixed batches, page sizes 1 and 16, and
GQA layouts including one KV head per rank (as under tensor parallelism) and plain MHA.
The reference (`torch_backend.py`: gathered K/V repeated per query head, one SDPA) is the
oracle; float32 must agree to rounding, bfloat16 within the stated tolerance. The grouped
backend runs twice: with the C++ paged kernel (its default where g++ builds it) and on its
PyTorch path alone (the fallback where no compiler is).
"""

from __future__ import annotations

import dataclasses
import random
import shutil
from dataclasses import dataclass

import pytest
import torch

from radixserve.engine.attention import AttentionBackend, create_attention_backend
from radixserve.engine.attention.grouped_backend import GroupedAttnBackend
from radixserve.engine.configs.cpu_features import cpu_flags
from radixserve.engine.forward_batch import ForwardBatch, ForwardMode
from radixserve.engine.layers.radix_attention import RadixAttention
from radixserve.engine.mem_cache import MHATokenToKVPool, ReqToTokenPool, create_allocator
from radixserve.kernels.cpu.paged_attention import load_paged_attention
from tests.kernels.amx import cpu_has_amx

HEAD_DIM = 64
# (atol, rtol) per dtype: float32 differs by summation order only; bfloat16 outputs carry
# 8 mantissa bits (relative step 2^-8 ≈ 0.004), and the reference rounds its repeated K/V
# and probabilities differently, so a few steps of difference are allowed.
TOLERANCE = {torch.float32: (2e-5, 1e-5), torch.bfloat16: (3e-2, 2e-2)}


@dataclass
class Pools:
    req_to_token: ReqToTokenPool
    kv: MHATokenToKVPool
    allocator: object
    page_size: int


def make_pools(
    page_size: int, dtype: torch.dtype, kv_heads: int, size: int = 4096, context: int = 1024
) -> Pools:
    cpu = torch.device("cpu")
    return Pools(
        ReqToTokenPool(16, context, cpu),
        MHATokenToKVPool(size, page_size, dtype, kv_heads, HEAD_DIM, 1, cpu),
        create_allocator(size, page_size, cpu),
        page_size,
    )


def make_batch(
    pools: Pools, mode: ForwardMode, rows: list[int], prefix: list[int], ext: list[int]
) -> ForwardBatch:
    """Allocate slots for positions [prefix, prefix + ext) of each row, as the scheduler does."""
    table = pools.req_to_token.req_to_token
    seq = [p + e for p, e in zip(prefix, ext, strict=True)]
    last = [int(table[r, p - 1]) if p else -1 for r, p in zip(rows, prefix, strict=True)]
    slots = pools.allocator.alloc_extend(prefix, seq, last)  # type: ignore[attr-defined]
    assert slots is not None
    start = 0
    for r, p, e in zip(rows, prefix, ext, strict=True):
        pools.req_to_token.write(r, p, slots[start : start + e])
        start += e
    idx = torch.tensor(rows, dtype=torch.int64)
    total = sum(ext)
    return ForwardBatch(
        forward_mode=mode,
        batch_size=len(rows),
        input_ids=torch.zeros(total, dtype=torch.int64),
        positions=torch.tensor([p + j for p, e in zip(prefix, ext, strict=True) for j in range(e)]),
        req_pool_indices=idx,
        seq_lens=torch.tensor(seq, dtype=torch.int64),
        out_cache_loc=slots,
        extend_prefix_lens_cpu=list(prefix),
        extend_seq_lens_cpu=list(ext),
        seq_lens_cpu=seq,
        req_to_token_pool=pools.req_to_token,
        token_to_kv_pool=pools.kv,
        attn_backend=create_attention_backend("torch"),
        kv_rows=table[idx, : max(seq)].to(torch.int64),
    )


def grouped_variant(name: str) -> AttentionBackend:
    """'kernel': the registry's grouped backend (the C++ kernel where it builds, extends
    through its tiled entry where the build has one); 'sdpa': the kernel for one-token rows
    only, extends on SDPA (--disable-tiled-extend); 'pytorch': the backend without the
    kernel."""
    if name == "kernel":
        return create_attention_backend("grouped")
    if name == "sdpa":
        return GroupedAttnBackend(load_paged_attention(), tiled_extend=False)
    return GroupedAttnBackend(None)


def run_both(
    fb: ForwardBatch,
    layer: RadixAttention,
    dtype: torch.dtype,
    gen: torch.Generator,
    fast: str = "kernel",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Same q/k/v through both backends (each writes the same K/V to the same slots). q is
    a strided view of a fused qkv row, as the models hand it over."""
    t = int(fb.out_cache_loc.numel())
    hq, hkv = layer.num_heads * HEAD_DIM, layer.num_kv_heads * HEAD_DIM
    qkv = torch.randn(t, hq + 2 * hkv, generator=gen).to(dtype)
    q, k, v = qkv.split([hq, hkv, hkv], dim=-1)
    outs = []
    for backend in (create_attention_backend("torch"), grouped_variant(fast)):
        run = dataclasses.replace(fb, attn_backend=backend)  # ForwardBatch is frozen
        backend.init_forward_metadata(run)
        outs.append(backend.forward(q, k, v, layer, run).float())
    return outs[0], outs[1]


def prefill(pools: Pools, rows: list[int], lens: list[int], layer: RadixAttention) -> None:
    """Fill the rows' first `lens` positions through the reference backend."""
    fb = make_batch(pools, ForwardMode.EXTEND, rows, [0] * len(rows), lens)
    run_both(fb, layer, pools.kv.dtype, torch.Generator().manual_seed(0))


LAYOUTS = [(9, 3), (4, 1), (4, 4), (6, 1)]  # SmolLM2; one KV head per TP rank; MHA; G=6
DTYPES = [torch.float32, torch.bfloat16]


@pytest.mark.parametrize("fast", ["kernel", "sdpa", "pytorch"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", LAYOUTS, ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extend_decode_and_mixed_match_the_reference(
    page_size: int, heads: tuple[int, int], dtype: torch.dtype, fast: str
) -> None:
    num_heads, kv_heads = heads
    layer = RadixAttention(num_heads, HEAD_DIM, HEAD_DIM**-0.5, kv_heads, layer_id=0)
    pools = make_pools(page_size, dtype, kv_heads)
    gen = torch.Generator().manual_seed(page_size * 100 + num_heads)
    atol, rtol = TOLERANCE[dtype]
    rng = random.Random(7)
    lens = [rng.randrange(1, 70) for _ in range(5)]

    # extend from empty (causal, no prefix): 5 requests of different lengths
    fb = make_batch(pools, ForwardMode.EXTEND, list(range(5)), [0] * 5, lens)
    ref, got = run_both(fb, layer, dtype, gen, fast)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)

    # extend over a cached prefix (chunked prefill / radix hit): 2..20 new tokens each
    ext = [rng.randrange(2, 21) for _ in range(5)]
    fb = make_batch(pools, ForwardMode.EXTEND, list(range(5)), lens, ext)
    ref, got = run_both(fb, layer, dtype, gen, fast)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    lens = [a + b for a, b in zip(lens, ext, strict=True)]

    # three decode steps of the whole batch (different lengths, padding masked)
    for _ in range(3):
        fb = make_batch(pools, ForwardMode.DECODE, list(range(5)), lens, [1] * 5)
        ref, got = run_both(fb, layer, dtype, gen, fast)
        torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
        lens = [n + 1 for n in lens]

    # mixed: a new request's prefill chunk and a prefix-hit chunk plus the running decodes
    prefill(pools, [5], [33], layer)
    rows, prefix, extend = [6, 5, *range(5)], [0, 33, *lens], [40, 17, 1, 1, 1, 1, 1]
    fb = make_batch(pools, ForwardMode.MIXED, rows, prefix, extend)
    ref, got = run_both(fb, layer, dtype, gen, fast)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)


@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_long_extends_match_the_reference(page_size: int, dtype: torch.dtype) -> None:
    """Prompts of thousands of tokens, as the tiled kernel takes them (the default where it
    builds): a batch of prefills of different lengths, then extends over their cached
    prefixes up to SmolLM2's 8192 tokens, one cold prompt beside them."""
    layer = RadixAttention(9, HEAD_DIM, HEAD_DIM**-0.5, 3, layer_id=0)
    pools = make_pools(page_size, dtype, 3, size=14336, context=8192)
    gen = torch.Generator().manual_seed(page_size)
    atol, rtol = TOLERANCE[dtype]
    fb = make_batch(pools, ForwardMode.EXTEND, [0, 1, 2], [0, 0, 0], [4000, 700, 33])
    ref, got = run_both(fb, layer, dtype, gen)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
    fb = make_batch(pools, ForwardMode.EXTEND, [0, 1, 3], [4000, 700, 0], [4192, 300, 1200])
    ref, got = run_both(fb, layer, dtype, gen)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)


def test_the_tiled_extend_is_the_default_where_the_kernel_has_it() -> None:
    """The registry's grouped backend hands its extends to the tiled entry wherever the
    kernel built with it (an AVX-512 CPU), and builds no SDPA masks for them;
    `tiled_extend=False`, or no kernel, keeps SDPA with its masks."""
    pools = make_pools(1, torch.bfloat16, 3)
    make_batch(pools, ForwardMode.EXTEND, [0, 1], [0, 0], [40, 9])
    fb = make_batch(pools, ForwardMode.EXTEND, [0, 1], [40, 9], [20, 7])
    kernel = load_paged_attention()
    for backend, tiled in (
        (create_attention_backend("grouped"), kernel is not None and kernel.has_extend),
        (GroupedAttnBackend(kernel, tiled_extend=False), False),
        (GroupedAttnBackend(None), False),
    ):
        assert isinstance(backend, GroupedAttnBackend)
        backend.init_forward_metadata(fb)
        meta = backend._metadata(fb)
        assert (meta.tiled is not None) == tiled
        assert meta.tiled is None or meta.tiled.members == (0, 1)
        assert all((r.mask is None) == tiled for r in meta.extend_reqs)


def test_extends_the_tiled_entry_refuses_fall_back_to_sdpa() -> None:
    """float16 (no dtype code of the kernel): the rows planned for the tiled entry go through
    SDPA after all, with the causal masks it then builds itself."""
    pools = make_pools(16, torch.float16, 3)
    layer = RadixAttention(9, HEAD_DIM, HEAD_DIM**-0.5, 3, layer_id=0)
    gen = torch.Generator().manual_seed(4)
    prefill(pools, [0, 1], [40, 9], layer)
    fb = make_batch(pools, ForwardMode.EXTEND, [0, 1], [40, 9], [20, 7])
    backend = create_attention_backend("grouped")
    assert isinstance(backend, GroupedAttnBackend)
    backend.init_forward_metadata(fb)
    kernel = load_paged_attention()
    assert (backend._metadata(fb).tiled is not None) == (kernel is not None and kernel.has_extend)
    ref, got = run_both(fb, layer, torch.float16, gen)
    torch.testing.assert_close(got, ref, atol=5e-3, rtol=5e-3)


def share_prefix(pools: Pools, source: int, rows: list[int], n: int) -> None:
    """Map `source`'s first n slots into `rows`, as a radix-cache hit does (no copy)."""
    slots = pools.req_to_token.req_to_token[source, :n].clone()
    for r in rows:
        pools.req_to_token.write(r, 0, slots)


@pytest.mark.parametrize("fast", ["kernel", "sdpa"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("heads", [(9, 3), (4, 4)], ids=lambda h: f"{h[0]}q{h[1]}kv")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_extends_sharing_a_cached_prefix_match_the_reference(
    page_size: int, heads: tuple[int, int], dtype: torch.dtype, fast: str
) -> None:
    """Requests whose cached prefixes are the same slots go through the shared-prefix
    (cascade) path where the backend groups them (with SDPA extends, or with AMX), else each
    through the tiled entry: with and without own cached slots beyond the shared part, a
    prefix shared only in part, ragged new-token counts, beside a decode and a cold request."""
    num_heads, kv_heads = heads
    layer = RadixAttention(num_heads, HEAD_DIM, HEAD_DIM**-0.5, kv_heads, layer_id=0)
    pools = make_pools(page_size, dtype, kv_heads)
    gen = torch.Generator().manual_seed(page_size + num_heads)
    atol, rtol = TOLERANCE[dtype]
    shared = 96  # whole pages at both page sizes
    prefill(pools, [0], [shared], layer)
    share_prefix(pools, 0, [1, 2, 3, 4, 5], shared)

    # all members cached exactly the shared prefix: the batched new-token path
    fb = make_batch(
        pools, ForwardMode.EXTEND, [1, 2, 3, 9], [shared, shared, shared, 0], [5, 17, 9, 30]
    )
    backend = grouped_variant(fast)
    assert isinstance(backend, GroupedAttnBackend)
    # The CPU's flags decide: AMX groups them; without it the tiled entry (AVX-512) takes
    # each member instead, unless extends are on SDPA
    tiled = fast == "kernel" and "avx512f" in cpu_flags()
    grouping = not tiled or cpu_has_amx()
    backend.init_forward_metadata(fb)
    groups = backend._metadata(fb).prefix_groups
    want = [(shared, (0, 1, 2))] if grouping else []
    assert [(g.slots.numel(), g.members) for g in groups] == want
    ref, got = run_both(fb, layer, dtype, gen, fast)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)

    # members with own cached slots after the shared part (rows 1-3 grew above), a decode
    # (one new token over a prefix) and a request sharing only the first 80 slots
    share_prefix(pools, 0, [6], 80)
    prefill_rest = make_batch(pools, ForwardMode.EXTEND, [6], [80], [16])
    run_both(prefill_rest, layer, dtype, gen)
    rows, prefix, ext = (
        [1, 2, 3, 4, 5, 6],
        [shared + 5, shared + 17, shared + 9, shared, shared, 96],
        [3, 11, 1, 8, 2, 6],
    )
    fb = make_batch(pools, ForwardMode.EXTEND, rows, prefix, ext)
    backend.init_forward_metadata(fb)
    groups = backend._metadata(fb).prefix_groups
    assert [(g.slots.numel(), len(g.members)) for g in groups] == ([(80, 5)] if grouping else [])
    ref, got = run_both(fb, layer, dtype, gen, fast)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)

    # decode steps over the shared slots, beside row 9 with a history of its own: rows 1-6
    # share 80 slots, so with AMX the first 64 (two whole blocks) go on tiles for all six
    lens = [p + e for p, e in zip(prefix, ext, strict=True)] + [30]
    for _ in range(2):
        fb = make_batch(pools, ForwardMode.DECODE, [*rows, 9], lens, [1] * 7)
        backend.init_forward_metadata(fb)
        decode = backend._metadata(fb).decode
        assert decode is not None
        if backend._kernel is not None and cpu_has_amx():  # the CPU's flags decide
            assert decode.shared is not None
            assert decode.shared.slots.numel() == 64
            assert decode.shared.members.tolist() == [0, 1, 2, 3, 4, 5]
        ref, got = run_both(fb, layer, dtype, gen, fast)
        torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
        lens = [n + 1 for n in lens]

    # MIXED: those six rows decode beside a new prefill chunk (row 10); their one-token rows
    # still form the shared group, indexed among the batch's kernel rows, which start with
    # the chunk's last token (every extend's last token is a kernel row)
    fb = make_batch(pools, ForwardMode.MIXED, [10, *rows], [0, *lens[:6]], [24] + [1] * 6)
    backend.init_forward_metadata(fb)
    decode = backend._metadata(fb).decode
    assert decode is not None
    if backend._kernel is not None and cpu_has_amx():  # the CPU's flags decide
        assert decode.shared is not None and decode.shared.members.tolist() == list(range(1, 7))
    ref, got = run_both(fb, layer, dtype, gen, fast)
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)


def test_forward_without_metadata_is_an_error() -> None:
    layer = RadixAttention(9, HEAD_DIM, 0.125, 3, layer_id=0)
    pools = make_pools(1, torch.float32, 3)
    fb = make_batch(pools, ForwardMode.EXTEND, [0], [0], [4])
    x = torch.zeros(4, 9 * HEAD_DIM)
    kv = torch.zeros(4, 3 * HEAD_DIM)
    with pytest.raises(RuntimeError, match="init_forward_metadata"):
        create_attention_backend("grouped").forward(x, kv, kv, layer, fb)


@pytest.mark.skipif(shutil.which("g++") is None, reason="no C++ compiler: PyTorch path only")
def test_the_kernel_builds_where_a_compiler_is() -> None:
    """Where g++ is, the default grouped backend must not silently fall back."""
    assert load_paged_attention() is not None
