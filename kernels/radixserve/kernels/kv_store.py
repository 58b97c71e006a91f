# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launchers below them are fully typed.)
"""The KV store: scatter the new tokens' K/V rows into the pool at their slots.

Owns one kernel and its launcher; mutates only the two pool buffers it is given, knows no engine.
Runs in the scheduler process, inside the model's forward, before attention reads the pool.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.triton_util import require_unit_stride


@triton.jit
def _store_kv_kernel(  # noqa: PLR0913 -- a kernel takes every stride as an argument
    K,
    V,
    KBuf,
    VBuf,
    loc,
    stride_kt,
    stride_kh,
    stride_vt,
    stride_vh,
    stride_kbt,
    stride_kbh,
    stride_vbt,
    stride_vbh,
    NUM_HEADS: tl.constexpr,
    HEAD_DIM: tl.constexpr,
    V_DIM: tl.constexpr,
    BLOCK_H: tl.constexpr,
    BLOCK_D: tl.constexpr,
    BLOCK_DV: tl.constexpr,
):
    t = tl.program_id(0)
    slot = tl.load(loc + t).to(tl.int64)
    offs_h = tl.arange(0, BLOCK_H)
    h_mask = offs_h < NUM_HEADS
    offs_d = tl.arange(0, BLOCK_D)
    k_mask = h_mask[:, None] & (offs_d < HEAD_DIM)[None, :]
    k = tl.load(K + t * stride_kt + offs_h[:, None] * stride_kh + offs_d[None, :], mask=k_mask)
    tl.store(
        KBuf + slot * stride_kbt + offs_h[:, None] * stride_kbh + offs_d[None, :],
        k.to(KBuf.dtype.element_ty),
        mask=k_mask,
    )
    offs_dv = tl.arange(0, BLOCK_DV)
    v_mask = h_mask[:, None] & (offs_dv < V_DIM)[None, :]
    v = tl.load(V + t * stride_vt + offs_h[:, None] * stride_vh + offs_dv[None, :], mask=v_mask)
    tl.store(
        VBuf + slot * stride_vbt + offs_h[:, None] * stride_vbh + offs_dv[None, :],
        v.to(VBuf.dtype.element_ty),
        mask=v_mask,
    )


def store_kv(
    k_buffer: torch.Tensor,
    v_buffer: torch.Tensor,
    loc: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
) -> None:
    """Write k[t], v[t] into k_buffer[loc[t]], v_buffer[loc[t]] for every new token t, in place.

    k_buffer: [num_slots, num_kv_heads, head_dim]; v_buffer: [num_slots, num_kv_heads, v_head_dim].
    loc: [num_tokens], int32/int64, distinct slots (`out_cache_loc`; padding rows may all point
    at the reserved slot 0). k: [num_tokens, num_kv_heads, head_dim]; v likewise with v_head_dim;
    cast to the pool's dtype. Rows not named in loc are untouched.
    """
    num_tokens, num_kv_heads, head_dim = k.shape
    require_unit_stride(k_buffer=k_buffer, v_buffer=v_buffer, loc=loc, k=k, v=v)
    if num_tokens == 0:
        return
    v_dim = v.shape[2]
    _store_kv_kernel[(num_tokens,)](
        k, v, k_buffer, v_buffer, loc,
        k.stride(0), k.stride(1), v.stride(0), v.stride(1),
        k_buffer.stride(0), k_buffer.stride(1), v_buffer.stride(0), v_buffer.stride(1),
        NUM_HEADS=num_kv_heads, HEAD_DIM=head_dim, V_DIM=v_dim,
        BLOCK_H=triton.next_power_of_2(num_kv_heads), BLOCK_D=triton.next_power_of_2(head_dim),
        BLOCK_DV=triton.next_power_of_2(v_dim),
    )  # fmt: skip
