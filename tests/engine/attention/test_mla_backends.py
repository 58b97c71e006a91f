"""Absorbed MLA attention (one latent KV head of width 576 whose first 512 columns are the
values, 16 query heads: DeepSeek-V2-Lite's shapes) through the grouped backend, with the C++
MLA decode kernel and on its PyTorch path alone, against the PyTorch reference backend, over
the latent pool: extend from empty and over a cached prefix, decode steps, and a MIXED batch
(prefill chunks beside running decodes, whose one-token rows take the kernel), page sizes 1
and 16, float32 and bfloat16; also shared cached prefixes (a radix hit), which the grouped
backend's cascade path must leave to the per-request path for MLA."""

from __future__ import annotations

import dataclasses
import random
import shutil

import pytest
import torch

from radixserve.engine.attention import AttentionBackend, create_attention_backend
from radixserve.engine.attention.grouped_backend import GroupedAttnBackend
from radixserve.engine.attention.spec import AttentionSpec
from radixserve.engine.forward_batch import ForwardBatch, ForwardMode
from radixserve.engine.layers.radix_attention import RadixAttention
from radixserve.engine.mem_cache import MLATokenToKVPool, ReqToTokenPool, create_allocator
from tests.engine.attention.test_grouped_backend import TOLERANCE, Pools, make_batch, share_prefix

HEADS, KV_LORA, ROPE = 16, 512, 64
LATENT = KV_LORA + ROPE


def mla_pools(page_size: int, dtype: torch.dtype) -> Pools:
    cpu = torch.device("cpu")
    return Pools(
        ReqToTokenPool(16, 1024, cpu),
        MLATokenToKVPool(4096, page_size, dtype, KV_LORA, ROPE, 1, cpu),
        create_allocator(4096, page_size, cpu),
        page_size,
    )


def grouped(fast: str, dtype: torch.dtype) -> AttentionBackend:
    if fast == "pytorch":
        return GroupedAttnBackend(None)
    spec = AttentionSpec(HEADS, 1, LATENT, dtype, torch.device("cpu"), 16, 1024, v_head_dim=KV_LORA)
    backend = create_attention_backend("grouped", spec)
    if shutil.which("g++") is not None:
        assert isinstance(backend, GroupedAttnBackend) and backend._mla_kernel is not None
    return backend


def run_both(
    fb: ForwardBatch, layer: RadixAttention, gen: torch.Generator, fast: str
) -> tuple[torch.Tensor, torch.Tensor]:
    """The same queries and latent rows through the reference and the grouped backend."""
    dtype = fb.token_to_kv_pool.dtype
    t = int(fb.out_cache_loc.numel())
    q = torch.randn(t, HEADS * LATENT, generator=gen).to(dtype)
    latent = torch.randn(t, LATENT, generator=gen).to(dtype)
    outs = []
    for backend in (create_attention_backend("torch"), grouped(fast, dtype)):
        run = dataclasses.replace(fb, attn_backend=backend)
        backend.init_forward_metadata(run)
        outs.append(backend.forward(q, latent, latent[:, :KV_LORA], layer, run).float())
    assert outs[0].shape == (t, HEADS * KV_LORA)
    return outs[0], outs[1]


@pytest.mark.parametrize("fast", ["kernel", "pytorch"])
@pytest.mark.parametrize("page_size", [1, 16])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_mla_extend_decode_and_mixed_match_the_reference(
    page_size: int, dtype: torch.dtype, fast: str
) -> None:
    layer = RadixAttention(HEADS, LATENT, 192**-0.5, 1, layer_id=0, v_head_dim=KV_LORA)
    pools = mla_pools(page_size, dtype)
    gen = torch.Generator().manual_seed(page_size)
    atol, rtol = TOLERANCE[dtype]
    rng = random.Random(3)
    lens = [rng.randrange(1, 70) for _ in range(4)]
    fb = make_batch(pools, ForwardMode.EXTEND, list(range(4)), [0] * 4, lens)
    torch.testing.assert_close(*reversed(run_both(fb, layer, gen, fast)), atol=atol, rtol=rtol)
    ext = [rng.randrange(2, 21) for _ in range(4)]
    fb = make_batch(pools, ForwardMode.EXTEND, list(range(4)), lens, ext)
    torch.testing.assert_close(*reversed(run_both(fb, layer, gen, fast)), atol=atol, rtol=rtol)
    lens = [a + b for a, b in zip(lens, ext, strict=True)]
    for _ in range(2):
        fb = make_batch(pools, ForwardMode.DECODE, list(range(4)), lens, [1] * 4)
        ref, got = run_both(fb, layer, gen, fast)
        torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
        lens = [n + 1 for n in lens]
    rows, prefix, extend = [5, *range(4)], [0, *lens], [30, 1, 1, 1, 1]
    fb = make_batch(pools, ForwardMode.MIXED, rows, prefix, extend)
    torch.testing.assert_close(*reversed(run_both(fb, layer, gen, fast)), atol=atol, rtol=rtol)


def test_mla_extends_sharing_a_cached_prefix_match_the_reference() -> None:
    layer = RadixAttention(HEADS, LATENT, 192**-0.5, 1, layer_id=0, v_head_dim=KV_LORA)
    pools = mla_pools(1, torch.float32)
    gen = torch.Generator().manual_seed(11)
    fb = make_batch(pools, ForwardMode.EXTEND, [0], [0], [96])
    run_both(fb, layer, gen, "kernel")
    share_prefix(pools, 0, [1, 2, 3], 96)
    fb = make_batch(pools, ForwardMode.EXTEND, [1, 2, 3], [96] * 3, [5, 17, 9])
    ref, got = run_both(fb, layer, gen, "kernel")
    atol, rtol = TOLERANCE[torch.float32]
    torch.testing.assert_close(got, ref, atol=atol, rtol=rtol)
