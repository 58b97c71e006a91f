# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launcher below is fully typed.)
"""Rotary position embedding, neox style (half rotation), as Llama, Qwen2 and Qwen3 use it.

Owns one kernel and its launcher; writes only the outputs it is given or returns, knows no
engine. Runs in the scheduler process, inside the model's forward.

With rotary_dim = R <= head_dim and half = R / 2, for each head: x1 = x[:half],
x2 = x[half:R]; out[:half] = x1 cos - x2 sin, out[half:R] = x2 cos + x1 sin, out[R:] = x[R:],
where cos/sin come from row `position` of the [max_pos, R] cache laid out as [cos | sin].

`rotary_tables_` is the engine's form (`layers.rotary_embedding.apply_rotary`): the batch's
cos/sin rows [T, 1, D] already gathered in the model dtype, q/k rotated in place with the
PyTorch expression's roundings, `q * cos + rotate_half(q) * sin` (each product and the sum
rounded to the dtype).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.layout import RotaryOutput
from radixserve.kernels.triton_util import cast, require_unit_stride, round_to


@triton.jit
def _rotate_heads(  # noqa: PLR0913 -- one token's heads of q or k, strides as arguments
    X, Out, t, stride_xt, stride_xh, stride_ot, stride_oh, cos, sin,
    NUM_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr, HALF: tl.constexpr,
    BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):  # fmt: skip
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HALF)[None, :]
    src = X + t * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    dst = Out + t * stride_ot + offs_h[:, None] * stride_oh + offs_d[None, :]
    x1 = tl.load(src, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF, mask=mask, other=0.0).to(tl.float32)
    tl.store(dst, (x1 * cos - x2 * sin).to(Out.dtype.element_ty), mask=mask)
    tl.store(dst + HALF, (x2 * cos + x1 * sin).to(Out.dtype.element_ty), mask=mask)
    if BLOCK_REST > 0:  # partial rotary: the dims past rotary_dim pass through
        offs_r = 2 * HALF + tl.arange(0, BLOCK_REST)
        r_mask = (offs_h < NUM_HEADS)[:, None] & (offs_r < HEAD_DIM)[None, :]
        rest = tl.load(
            X + t * stride_xt + offs_h[:, None] * stride_xh + offs_r[None, :], mask=r_mask
        )
        tl.store(
            Out + t * stride_ot + offs_h[:, None] * stride_oh + offs_r[None, :],
            rest.to(Out.dtype.element_ty),
            mask=r_mask,
        )


@triton.jit
def _rotary_kernel(  # noqa: PLR0913 -- a kernel takes every stride as an argument
    Pos, Q, K, Cache, OutQ, OutK,
    stride_qt, stride_qh, stride_kt, stride_kh, stride_oqt, stride_oqh, stride_okt, stride_okh,
    stride_c,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HEAD_DIM: tl.constexpr,
    HALF: tl.constexpr, BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr,
    BLOCK_HALF: tl.constexpr, BLOCK_REST: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    pos = tl.load(Pos + t).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    c_mask = offs_d < HALF
    cos = tl.load(Cache + pos * stride_c + offs_d, mask=c_mask, other=0.0).to(tl.float32)
    sin = tl.load(Cache + pos * stride_c + HALF + offs_d, mask=c_mask, other=0.0).to(tl.float32)
    cos, sin = cos[None, :], sin[None, :]
    _rotate_heads(Q, OutQ, t, stride_qt, stride_qh, stride_oqt, stride_oqh, cos, sin,
                  NUM_Q_HEADS, HEAD_DIM, HALF, BLOCK_HQ, BLOCK_HALF, BLOCK_REST)  # fmt: skip
    _rotate_heads(K, OutK, t, stride_kt, stride_kh, stride_okt, stride_okh, cos, sin,
                  NUM_K_HEADS, HEAD_DIM, HALF, BLOCK_HK, BLOCK_HALF, BLOCK_REST)  # fmt: skip


def rotary(
    positions: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    cos_sin_cache: torch.Tensor,
    out_q: torch.Tensor | None = None,
    out_k: torch.Tensor | None = None,
) -> RotaryOutput:
    """Rotate q and k by their tokens' positions (neox style; see the module docstring).

    positions: [num_tokens], int32/int64. q: [num_tokens, num_heads, head_dim]; k:
    [num_tokens, num_kv_heads, head_dim]; last dims contiguous. cos_sin_cache: [max_pos,
    rotary_dim], fp32 (or the model dtype), rotary_dim even and <= head_dim, rows [cos | sin].
    out_q / out_k: outputs; pass q / k themselves to rotate in place (each element is read
    before it is written), or None to allocate new tensors. Returns RotaryOutput(out_q, out_k).
    """
    num_tokens, num_heads, head_dim = q.shape
    num_kv_heads = k.shape[1]
    half = cos_sin_cache.shape[1] // 2
    out_q = torch.empty_like(q) if out_q is None else out_q
    out_k = torch.empty_like(k) if out_k is None else out_k
    require_unit_stride(positions=positions, q=q, k=k, cos_sin_cache=cos_sin_cache, out_q=out_q,
                        out_k=out_k)  # fmt: skip
    if num_tokens == 0:
        return RotaryOutput(out_q, out_k)
    rest = head_dim - 2 * half
    _rotary_kernel[(num_tokens,)](
        positions, q, k, cos_sin_cache, out_q, out_k,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        out_q.stride(0), out_q.stride(1), out_k.stride(0), out_k.stride(1), cos_sin_cache.stride(0),
        NUM_Q_HEADS=num_heads, NUM_K_HEADS=num_kv_heads, HEAD_DIM=head_dim, HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(num_kv_heads),
        BLOCK_HALF=triton.next_power_of_2(half),
        BLOCK_REST=triton.next_power_of_2(rest) if rest > 0 else 0,
    )  # fmt: skip
    return RotaryOutput(out_q, out_k)


@triton.jit
def _rotate_heads_tables(  # noqa: PLR0913 -- one token's heads of q or k, in place
    X, t, stride_xt, stride_xh, c1, c2, s1, s2,
    NUM_HEADS: tl.constexpr, HALF: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    dt = X.dtype.element_ty
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_HALF)
    mask = (offs_h < NUM_HEADS)[:, None] & (offs_d < HALF)[None, :]
    ptr = X + t * stride_xt + offs_h[:, None] * stride_xh + offs_d[None, :]
    x1 = tl.load(ptr, mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(ptr + HALF, mask=mask, other=0.0).to(tl.float32)
    out1 = round_to(x1 * c1, dt) + round_to(-x2 * s1, dt)
    out2 = round_to(x2 * c2, dt) + round_to(x1 * s2, dt)
    tl.store(ptr, cast(out1, dt), mask=mask)
    tl.store(ptr + HALF, cast(out2, dt), mask=mask)


@triton.jit
def _rotary_tables_kernel(  # noqa: PLR0913 -- a kernel takes every stride as an argument
    Q, K, Cos, Sin, stride_qt, stride_qh, stride_kt, stride_kh, stride_ct, stride_st,
    NUM_Q_HEADS: tl.constexpr, NUM_K_HEADS: tl.constexpr, HALF: tl.constexpr,
    BLOCK_HQ: tl.constexpr, BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_d = tl.arange(0, BLOCK_HALF)
    m = offs_d < HALF
    c1 = tl.load(Cos + t * stride_ct + offs_d, mask=m, other=0.0).to(tl.float32)[None, :]
    c2 = tl.load(Cos + t * stride_ct + HALF + offs_d, mask=m, other=0.0).to(tl.float32)[None, :]
    s1 = tl.load(Sin + t * stride_st + offs_d, mask=m, other=0.0).to(tl.float32)[None, :]
    s2 = tl.load(Sin + t * stride_st + HALF + offs_d, mask=m, other=0.0).to(tl.float32)[None, :]
    _rotate_heads_tables(Q, t, stride_qt, stride_qh, c1, c2, s1, s2,
                         NUM_Q_HEADS, HALF, BLOCK_HQ, BLOCK_HALF)  # fmt: skip
    _rotate_heads_tables(K, t, stride_kt, stride_kh, c1, c2, s1, s2,
                         NUM_K_HEADS, HALF, BLOCK_HK, BLOCK_HALF)  # fmt: skip


def rotary_tables_(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> None:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by cos/sin [T, 1, D] (or [T, D]).

    Rotate-half form over the whole head: out = x * cos + cat(-x2, x1) * sin, each product and
    the sum rounded to q's dtype (the PyTorch expression's roundings). q, k, cos, sin share one
    dtype; any token/head strides (q/k may be views of a fused qkv projection), last dims
    contiguous, D even. Each element is read before it is written.
    """
    num_tokens, num_heads, head_dim = q.shape
    require_unit_stride(q=q, k=k, cos=cos, sin=sin)
    if num_tokens == 0:
        return
    half = head_dim // 2
    _rotary_tables_kernel[(num_tokens,)](
        q, k, cos, sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
        cos.stride(0), sin.stride(0),
        NUM_Q_HEADS=num_heads, NUM_K_HEADS=k.shape[1], HALF=half,
        BLOCK_HQ=triton.next_power_of_2(num_heads), BLOCK_HK=triton.next_power_of_2(k.shape[1]),
        BLOCK_HALF=triton.next_power_of_2(half),
    )  # fmt: skip
