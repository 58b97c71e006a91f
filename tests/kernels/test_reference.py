"""The references themselves against independent oracles (SDPA, torch's RMSNorm, dense loops).

Pure PyTorch: float64 inputs and oracles, references at their fp32 accuracy; no Triton involved.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixserve.kernels.layout import PagedKv, RaggedKv, TopKOutput
from radixserve.kernels.reference import (
    decode_attention_ref,
    extend_attention_ref,
    fused_moe_ref,
    rms_norm_ref,
    rotary_ref,
    silu_and_mul_ref,
    topk_softmax_ref,
)
from tests.kernels.cases import make_pool, paged_kv

F64 = torch.float64


def _close(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """The references do fp32 math: fp32 accuracy against a float64 oracle."""
    torch.testing.assert_close(actual, expected.to(actual.dtype), atol=1e-5, rtol=1e-5)


def _pool(gen: torch.Generator, lens: list[int], heads: int, dim: int) -> tuple[PagedKv, list]:
    pool = make_pool(lens, 16, gen, "cpu")
    bufs = (torch.randn(pool.num_slots, heads, dim, generator=gen, dtype=F64),
            torch.randn(pool.num_slots, heads, dim, generator=gen, dtype=F64))  # fmt: skip
    kv = paged_kv(pool, lens, bufs)
    starts = kv.kv_indptr.tolist()
    return kv, [kv.kv_indices[starts[i] : starts[i + 1]].long() for i in range(len(lens))]


def test_decode_reference_is_sdpa_on_the_gathered_rows(gen: torch.Generator) -> None:
    kv, slots = _pool(gen, [1, 20, 45], heads=2, dim=16)
    q = torch.randn(3, 8, 16, generator=gen, dtype=F64)
    got = decode_attention_ref(q, kv, 0.3)
    for i, s in enumerate(slots):
        k, v = kv.k_buffer[s].transpose(0, 1)[None], kv.v_buffer[s].transpose(0, 1)[None]
        want = F.scaled_dot_product_attention(q[i, :, None][None], k, v, scale=0.3, enable_gqa=True)
        _close(got[i], want[0, :, 0])


def test_decode_reference_soft_cap_is_the_formula(gen: torch.Generator) -> None:
    kv, slots = _pool(gen, [30], heads=1, dim=16)
    q = torch.randn(1, 2, 16, generator=gen, dtype=F64)
    k, v = kv.k_buffer[slots[0], 0], kv.v_buffer[slots[0], 0]
    scores = 5.0 * torch.tanh(q[0] @ k.T * 0.5 / 5.0)
    _close(decode_attention_ref(q, kv, 0.5, logit_cap=5.0)[0], torch.softmax(scores, -1) @ v)


@pytest.mark.parametrize("prefix_lens", [[0, 0], [5, 18]])
def test_extend_reference_is_sdpa_with_an_offset_causal_mask(
    prefix_lens: list[int], gen: torch.Generator
) -> None:
    ext_lens = [7, 3]
    prefix, slots = _pool(gen, prefix_lens, heads=2, dim=16)
    qo = torch.tensor([0, 7, 10], dtype=torch.int32)
    k_new, v_new = (torch.randn(10, 2, 16, generator=gen, dtype=F64) for _ in range(2))
    q = torch.randn(10, 4, 16, generator=gen, dtype=F64)
    got = extend_attention_ref(q, RaggedKv(k_new, v_new, qo, 7), prefix, 0.25)
    for i, (p, e) in enumerate(zip(prefix_lens, ext_lens, strict=True)):
        rows = slice(int(qo[i]), int(qo[i + 1]))
        k = torch.cat([prefix.k_buffer[slots[i]], k_new[rows]]).transpose(0, 1)[None]
        v = torch.cat([prefix.v_buffer[slots[i]], v_new[rows]]).transpose(0, 1)[None]
        mask = torch.ones(e, p + e, dtype=torch.bool).tril(diagonal=p)
        want = F.scaled_dot_product_attention(
            q[rows].transpose(0, 1)[None], k, v, attn_mask=mask, scale=0.25, enable_gqa=True
        )
        _close(got[rows], want[0].transpose(0, 1))


def test_rms_norm_reference_is_torchs(gen: torch.Generator) -> None:
    x, res = torch.randn(2, 5, 64, generator=gen).unbind(0)
    w = torch.randn(64, generator=gen)
    _close(rms_norm_ref(x, w, 1e-6).out, F.rms_norm(x, (64,), w, eps=1e-6))
    fused = rms_norm_ref(x, w, 1e-6, residual=res)
    _close(fused.out, F.rms_norm(x + res, (64,), w, eps=1e-6))
    assert fused.residual is not None
    _close(fused.residual, x + res)


def test_silu_and_mul_reference_is_the_formula(gen: torch.Generator) -> None:
    x = torch.randn(4, 2, 10, generator=gen, dtype=F64)
    gate, up = x[:, 0], x[:, 1]
    _close(silu_and_mul_ref(x.view(4, 20)), gate / (1 + torch.exp(-gate)) * up)


def test_rotary_reference_is_hf_rotate_half(gen: torch.Generator) -> None:
    """HF Llama: x * cos + rotate_half(x) * sin with cos/sin repeated over both halves."""
    positions = torch.tensor([0, 3, 11])
    inv_freq = 10000.0 ** (-torch.arange(0, 16, 2, dtype=F64) / 16)
    freqs = torch.arange(12, dtype=F64)[:, None] * inv_freq
    cache = torch.cat([freqs.cos(), freqs.sin()], -1)
    q, k = (
        torch.randn(3, 4, 16, generator=gen, dtype=F64),
        torch.randn(3, 2, 16, generator=gen, dtype=F64),
    )
    emb = torch.cat([freqs, freqs], -1)[positions][:, None]

    def hf(x: torch.Tensor) -> torch.Tensor:
        rotated = torch.cat([-x[..., 8:], x[..., :8]], -1)
        return x * emb.cos() + rotated * emb.sin()

    got = rotary_ref(positions, q, k, cache)
    _close(got.q, hf(q))
    _close(got.k, hf(k))


@pytest.mark.parametrize("renormalize", [False, True])
def test_topk_reference_is_a_full_sort(renormalize: bool, gen: torch.Generator) -> None:
    logits = torch.randn(6, 10, generator=gen)
    got = topk_softmax_ref(logits, 3, renormalize)
    probs = torch.softmax(logits.double(), -1)
    order = probs.argsort(-1, descending=True)[:, :3]
    weights = probs.gather(1, order)
    if renormalize:
        weights = weights / weights.sum(-1, keepdim=True)
    assert torch.equal(got.ids.long(), order)
    _close(got.weights.double(), weights)


def test_fused_moe_reference_is_a_dense_per_token_loop(gen: torch.Generator) -> None:
    num_tokens, num_experts, hidden, inter, top_k = 7, 5, 12, 8, 2
    x = torch.randn(num_tokens, hidden, generator=gen, dtype=F64)
    w13 = torch.randn(num_experts, 2 * inter, hidden, generator=gen, dtype=F64)
    w2 = torch.randn(num_experts, hidden, inter, generator=gen, dtype=F64)
    ids = torch.stack([torch.randperm(num_experts, generator=gen)[:top_k] for _ in range(7)])
    topk = TopKOutput(torch.rand(num_tokens, top_k, generator=gen, dtype=F64), ids.to(torch.int32))
    want = torch.zeros_like(x)
    for t in range(num_tokens):
        for j in range(top_k):
            e = int(ids[t, j])
            gate, up = w13[e, :inter] @ x[t], w13[e, inter:] @ x[t]
            want[t] += topk.weights[t, j] * (w2[e] @ (F.silu(gate) * up))
    _close(fused_moe_ref(x, w13, w2, topk), want)
