# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launchers below them are fully typed.)
"""Paged decode attention: flash-decoding split-K over the KV length, then a combine stage.

Owns the two decode kernels and their launcher; takes plain tensors (a `PagedKv` view of the
pool), knows no engine, and writes the new token's K/V nowhere (call `store_kv` first). Runs in
the scheduler process, inside the model's forward.

Algorithm. Stage 1, grid (request, kv head, split): the request's cached tokens are cut into
`num_kv_splits` equal chunks; one program streams its chunk of slots through `kv_indices` in
blocks of BLOCK_N, for all GROUP = num_heads / num_kv_heads query heads of its KV head at once
(GQA: one K/V load serves the whole group, as a [BLOCK_H, BLOCK_N] tl.dot), keeps an online
softmax (running max, running sum) and writes the chunk's normalized output and log-sum-exp to an
fp32 scratch. Empty chunks (short requests) write nothing. Stage 2, grid (request, query head):
merges the non-empty chunks, each weighted by exp(lse_i - max lse).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.layout import PagedKv
from radixserve.kernels.triton_util import (
    dot,
    is_interpreted,
    load_rows,
    next_pow2,
    require_unit_stride,
    tanh,
)


@triton.jit
def _decode_split_kernel(  # noqa: PLR0913, PLR0915 -- a kernel takes every stride as an argument
    Q, K, V, kv_indptr, kv_indices, MidO, MidLse, sm_scale, logit_cap,
    stride_qb, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh,
    stride_mb, stride_mh, stride_ms,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr, BLOCK_N: tl.constexpr,
    NUM_SPLITS: tl.constexpr, HAS_CAP: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    offs_h = tl.arange(0, BLOCK_H)
    heads = kv_head * GROUP + offs_h
    h_mask = offs_h < GROUP
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < V_DIM

    kv_start = tl.load(kv_indptr + b)
    seq_len = tl.load(kv_indptr + b + 1) - kv_start
    split_len = tl.cdiv(seq_len, NUM_SPLITS)
    lo = split * split_len
    hi = tl.minimum(lo + split_len, seq_len)

    q = load_rows(Q + b * stride_qb, heads, stride_qh, offs_d, h_mask, d_mask)
    m_i = tl.zeros([BLOCK_H], dtype=tl.float32) - 1e30
    l_i = tl.zeros([BLOCK_H], dtype=tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_DV], dtype=tl.float32)
    for n0 in range(lo, hi, BLOCK_N):
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < hi
        slot = tl.load(kv_indices + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        k = load_rows(K + kv_head * stride_kh, slot, stride_kt, offs_d, n_mask, d_mask)
        s = dot(q, tl.trans(k), UPCAST) * sm_scale
        if HAS_CAP:
            s = logit_cap * tanh(s / logit_cap)
        s = tl.where(n_mask[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        alpha = tl.exp(m_i - m_new)
        p = tl.exp(s - m_new[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = load_rows(V + kv_head * stride_vh, slot, stride_vt, offs_dv, n_mask, dv_mask)
        acc = acc * alpha[:, None] + dot(p, v, UPCAST)
        m_i = m_new

    if hi > lo:
        mid = b * stride_mb + heads * stride_mh + split * stride_ms
        tl.store(
            MidO + mid[:, None] + offs_dv[None, :],
            acc / l_i[:, None],
            mask=h_mask[:, None] & dv_mask[None, :],
        )
        lse_off = (b * tl.num_programs(1) * GROUP + heads) * NUM_SPLITS + split
        tl.store(MidLse + lse_off, m_i + tl.log(l_i), mask=h_mask)


@triton.jit
def _decode_combine_kernel(  # noqa: PLR0913 -- strides are arguments
    MidO, MidLse, kv_indptr, Out, stride_mb, stride_mh, stride_ms, stride_ob, stride_oh,
    V_DIM: tl.constexpr, BLOCK_DV: tl.constexpr, NUM_SPLITS: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    num_heads = tl.num_programs(1)
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < V_DIM
    seq_len = tl.load(kv_indptr + b + 1) - tl.load(kv_indptr + b)
    split_len = tl.cdiv(seq_len, NUM_SPLITS)

    m_i = float("-inf")
    l_i = 0.0
    acc = tl.zeros([BLOCK_DV], dtype=tl.float32)
    for split in range(NUM_SPLITS):
        lo = split * split_len
        hi = tl.minimum(lo + split_len, seq_len)
        if hi > lo:
            o = tl.load(
                MidO + b * stride_mb + h * stride_mh + split * stride_ms + offs_dv,
                mask=dv_mask,
                other=0.0,
            )
            lse = tl.load(MidLse + (b * num_heads + h) * NUM_SPLITS + split)
            m_new = tl.maximum(m_i, lse)
            alpha = tl.exp(m_i - m_new)
            w = tl.exp(lse - m_new)
            acc = acc * alpha + w * o
            l_i = l_i * alpha + w
            m_i = m_new
    tl.store(
        Out + b * stride_ob + h * stride_oh + offs_dv,
        (acc / l_i).to(Out.dtype.element_ty),
        mask=dv_mask,
    )


def decode_attention(
    q: torch.Tensor,
    kv: PagedKv,
    sm_scale: float,
    *,
    logit_cap: float = 0.0,
    num_kv_splits: int = 8,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """One query token per request attends to all of its cached tokens (the new one included).

    q: [batch, num_heads, head_dim], fp32/fp16/bf16, last dim contiguous.
    kv: the pool and per-token slots (`PagedKv`); num_heads must be a multiple of num_kv_heads.
    Every request needs >= 1 cached token (CUDA-graph padding rows: length 1 at slot 0).
    sm_scale: the score scale (usually head_dim ** -0.5). logit_cap > 0 soft-caps the scaled
    scores as cap * tanh(s / cap). num_kv_splits: stage-1 chunks per request (SGLang's 8).
    out: [batch, num_heads, v_head_dim] in q's dtype, or None to allocate it. Returns out.
    """
    batch, num_heads, head_dim = q.shape
    num_kv_heads, v_dim = kv.k_buffer.shape[1], kv.v_buffer.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if out is None:
        out = q.new_empty(batch, num_heads, v_dim)
    require_unit_stride(q=q, k_buffer=kv.k_buffer, v_buffer=kv.v_buffer, out=out,
                        kv_indptr=kv.kv_indptr, kv_indices=kv.kv_indices)  # fmt: skip
    if batch == 0:
        return out
    group = num_heads // num_kv_heads
    upcast = is_interpreted(q)
    mid_o = q.new_empty(batch, num_heads, num_kv_splits, v_dim, dtype=torch.float32)
    mid_lse = q.new_empty(batch, num_heads, num_kv_splits, dtype=torch.float32)
    block_dv = next_pow2(v_dim)
    _decode_split_kernel[(batch, num_kv_heads, num_kv_splits)](
        q, kv.k_buffer, kv.v_buffer, kv.kv_indptr, kv.kv_indices, mid_o, mid_lse,
        sm_scale, logit_cap,
        q.stride(0), q.stride(1), kv.k_buffer.stride(0), kv.k_buffer.stride(1),
        kv.v_buffer.stride(0), kv.v_buffer.stride(1),
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2),
        GROUP=group, HEAD_DIM=head_dim, V_DIM=v_dim,
        BLOCK_H=next_pow2(group), BLOCK_D=next_pow2(head_dim), BLOCK_DV=block_dv,
        BLOCK_N=16 if upcast else 64, NUM_SPLITS=num_kv_splits,
        HAS_CAP=logit_cap > 0, UPCAST=upcast,
    )  # fmt: skip
    _decode_combine_kernel[(batch, num_heads)](
        mid_o, mid_lse, kv.kv_indptr, out,
        mid_o.stride(0), mid_o.stride(1), mid_o.stride(2), out.stride(0), out.stride(1),
        V_DIM=v_dim, BLOCK_DV=block_dv, NUM_SPLITS=num_kv_splits,
    )  # fmt: skip
    return out
