# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launchers below them are fully typed.)
"""Extend (prefill) attention: new tokens over their cached prefix and, causally, each other.

Owns the extend kernel and its launcher; takes plain tensors, knows no engine, stores nothing in
the pool (call `store_kv` for the new tokens separately). Runs in the scheduler process, inside
the model's forward.

Algorithm, grid (request, query head, block of BLOCK_M new tokens): phase 1 streams the
request's cached prefix through `kv_indices` (every prefix token is visible to every new token,
no mask but the length); phase 2 streams the new tokens' dense K/V up to the block's last row
with the causal mask `key <= query`. Both phases update one online softmax (running max and
sum per row), so the result is a single softmax over prefix + new tokens.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.layout import PagedKv, RaggedKv
from radixserve.kernels.triton_util import (
    dot,
    is_interpreted,
    load_rows,
    next_pow2,
    require_unit_stride,
    tanh,
)


@triton.jit
def _online_step(  # noqa: PLR0913 -- the online-softmax state travels as arguments
    q, k, v, mask, m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP: tl.constexpr, UPCAST: tl.constexpr
):
    """One [BLOCK_M, BLOCK_N] block of the online softmax; returns the new (m_i, l_i, acc)."""
    s = dot(q, tl.trans(k), UPCAST) * sm_scale
    if HAS_CAP:
        s = logit_cap * tanh(s / logit_cap)
    s = tl.where(mask, s, float("-inf"))
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.exp(s - m_new[:, None])
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + dot(p, v, UPCAST)
    return m_new, l_i, acc


@triton.jit
def _extend_kernel(  # noqa: PLR0913, PLR0915 -- a kernel takes every stride as an argument
    Q, K_new, V_new, Out, K_buf, V_buf, qo_indptr, kv_indptr, kv_indices, sm_scale, logit_cap,
    stride_qt, stride_qh, stride_knt, stride_knh, stride_vnt, stride_vnh,
    stride_ot, stride_oh, stride_kbt, stride_kbh, stride_vbt, stride_vbh,
    GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, V_DIM: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_DV: tl.constexpr,
    HAS_CAP: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    h = tl.program_id(1)
    block_m = tl.program_id(2)
    kv_head = h // GROUP
    qo_start = tl.load(qo_indptr + b)
    ext_len = tl.load(qo_indptr + b + 1) - qo_start
    if block_m * BLOCK_M >= ext_len:
        return
    kv_start = tl.load(kv_indptr + b)
    prefix_len = tl.load(kv_indptr + b + 1) - kv_start

    offs_m = block_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < ext_len
    offs_d = tl.arange(0, BLOCK_D)
    d_mask = offs_d < HEAD_DIM
    offs_dv = tl.arange(0, BLOCK_DV)
    dv_mask = offs_dv < V_DIM
    rows = (qo_start + offs_m).to(tl.int64)
    q = load_rows(Q + h * stride_qh, rows, stride_qt, offs_d, m_mask, d_mask)
    m_i = tl.zeros([BLOCK_M], dtype=tl.float32) - 1e30
    l_i = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_DV], dtype=tl.float32)

    for n0 in range(0, prefix_len, BLOCK_N):  # phase 1: the cached prefix, through the pool
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < prefix_len
        slot = tl.load(kv_indices + kv_start + offs_n, mask=n_mask, other=0).to(tl.int64)
        k = load_rows(K_buf + kv_head * stride_kbh, slot, stride_kbt, offs_d, n_mask, d_mask)
        v = load_rows(V_buf + kv_head * stride_vbh, slot, stride_vbt, offs_dv, n_mask, dv_mask)
        m_i, l_i, acc = _online_step(
            q, k, v, n_mask[None, :], m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP, UPCAST
        )

    hi = tl.minimum(ext_len, (block_m + 1) * BLOCK_M)
    for n0 in range(0, hi, BLOCK_N):  # phase 2: the new tokens, causal
        offs_n = n0 + tl.arange(0, BLOCK_N)
        n_mask = offs_n < ext_len
        cols = (qo_start + offs_n).to(tl.int64)
        k = load_rows(K_new + kv_head * stride_knh, cols, stride_knt, offs_d, n_mask, d_mask)
        v = load_rows(V_new + kv_head * stride_vnh, cols, stride_vnt, offs_dv, n_mask, dv_mask)
        causal = n_mask[None, :] & (offs_n[None, :] <= offs_m[:, None])
        m_i, l_i, acc = _online_step(
            q, k, v, causal, m_i, l_i, acc, sm_scale, logit_cap, HAS_CAP, UPCAST
        )

    tl.store(
        Out + rows[:, None] * stride_ot + h * stride_oh + offs_dv[None, :],
        (acc / l_i[:, None]).to(Out.dtype.element_ty),
        mask=m_mask[:, None] & dv_mask[None, :],
    )


def extend_attention(
    q: torch.Tensor,
    new: RaggedKv,
    prefix: PagedKv,
    sm_scale: float,
    *,
    logit_cap: float = 0.0,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Attention of a ragged batch of new tokens over their cached prefix plus themselves.

    q: [num_new_tokens, num_heads, head_dim], rows grouped by request as `new.qo_indptr` says.
    new: the new tokens' dense K/V (`RaggedKv`), not yet needed in the pool.
    prefix: the pool and, per request, the slots of its cached prefix only (`PagedKv`; the
    request's prefix length is kv_indptr[i + 1] - kv_indptr[i], zero allowed).
    logit_cap > 0 soft-caps the scaled scores. out: [num_new_tokens, num_heads, v_head_dim] in
    q's dtype, or None to allocate it. Returns out.
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads, v_dim = new.k.shape[1], new.v.shape[2]
    if num_heads % num_kv_heads:
        raise ValueError(f"num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if out is None:
        out = q.new_empty(num_tokens, num_heads, v_dim)
    require_unit_stride(q=q, k=new.k, v=new.v, out=out, qo_indptr=new.qo_indptr,
                        k_buffer=prefix.k_buffer, v_buffer=prefix.v_buffer,
                        kv_indptr=prefix.kv_indptr, kv_indices=prefix.kv_indices)  # fmt: skip
    batch = int(new.qo_indptr.shape[0]) - 1
    if num_tokens == 0 or batch == 0 or new.max_len == 0:
        return out
    upcast = is_interpreted(q)
    block_m = 16 if upcast else 64
    kb, vb = prefix.k_buffer, prefix.v_buffer
    grid = (batch, num_heads, triton.cdiv(new.max_len, block_m))
    _extend_kernel[grid](
        q, new.k, new.v, out, kb, vb, new.qo_indptr, prefix.kv_indptr, prefix.kv_indices,
        sm_scale, logit_cap,
        q.stride(0), q.stride(1), new.k.stride(0), new.k.stride(1),
        new.v.stride(0), new.v.stride(1), out.stride(0), out.stride(1),
        kb.stride(0), kb.stride(1), vb.stride(0), vb.stride(1),
        GROUP=num_heads // num_kv_heads, HEAD_DIM=head_dim, V_DIM=v_dim,
        BLOCK_M=block_m, BLOCK_N=16 if upcast else 32,
        BLOCK_D=next_pow2(head_dim), BLOCK_DV=next_pow2(v_dim),
        HAS_CAP=logit_cap > 0, UPCAST=upcast,
    )  # fmt: skip
    return out
