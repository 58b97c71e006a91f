# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launcher below is fully typed.)
"""RMSNorm with an optional fused residual add (the pre-attention / pre-MLP norm of Llama/Qwen).

Owns one kernel and its launcher; writes only the outputs it returns, knows no engine. Runs in
the scheduler process, inside the model's forward.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.layout import NormOutput
from radixserve.kernels.triton_util import cast, require_unit_stride, round_to


@triton.jit
def _rms_norm_kernel(  # noqa: PLR0913 -- a kernel takes every stride as an argument
    X,
    Res,
    W,
    Out,
    ResOut,
    stride_x,
    stride_r,
    stride_o,
    stride_ro,
    eps,
    HIDDEN: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RES: tl.constexpr,
):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.arange(0, BLOCK)
    mask = offs < HIDDEN
    x = tl.load(X + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    if HAS_RES:
        r = tl.load(Res + t * stride_r + offs, mask=mask, other=0.0).to(tl.float32)
        x = round_to(x + r, ResOut.dtype.element_ty)  # the residual, in the model dtype
        tl.store(ResOut + t * stride_ro + offs, x.to(ResOut.dtype.element_ty), mask=mask)
    var = tl.sum(x * x, 0) / HIDDEN
    w = tl.load(W + offs, mask=mask, other=0.0).to(tl.float32)
    # As the PyTorch layer: the normed row is rounded to the output dtype before the weight.
    normed = round_to(x * tl.rsqrt(var + eps), Out.dtype.element_ty)
    tl.store(Out + t * stride_o + offs, cast(normed * w, Out.dtype.element_ty), mask=mask)


def rms_norm(
    x: torch.Tensor,
    weight: torch.Tensor,
    eps: float,
    residual: torch.Tensor | None = None,
    out: torch.Tensor | None = None,
    residual_out: torch.Tensor | None = None,
) -> NormOutput:
    """out = (h / sqrt(mean(h^2) + eps)) * weight, with h = x + residual if given, else x.

    x: [num_tokens, hidden], fp32/fp16/bf16, last dim contiguous; weight: [hidden].
    residual: [num_tokens, hidden] or None. The sum h is rounded to x's dtype, returned as the
    new residual (`residual_out`), and normed in fp32; the normed row is rounded to out's dtype
    before the weight multiplies it (the PyTorch layer's roundings, to nearest even, also under
    the interpreter). out / residual_out: preallocated outputs
    (may alias x / residual: each row is read before it is written), or None to allocate.
    Returns NormOutput(out, residual_out), residual_out None without a residual.
    """
    num_tokens, hidden = x.shape
    out = torch.empty_like(x) if out is None else out
    if residual is not None and residual_out is None:
        residual_out = torch.empty_like(x)
    require_unit_stride(x=x, weight=weight, residual=residual, out=out, residual_out=residual_out)
    if num_tokens == 0:
        return NormOutput(out, residual_out)
    res = x if residual is None else residual
    res_out = out if residual_out is None else residual_out
    _rms_norm_kernel[(num_tokens,)](
        x, res, weight, out, res_out,
        x.stride(0), res.stride(0), out.stride(0), res_out.stride(0), eps,
        HIDDEN=hidden, BLOCK=triton.next_power_of_2(hidden), HAS_RES=residual is not None,
        num_warps=8 if hidden >= 2048 else 4,
    )  # fmt: skip
    return NormOutput(out, residual_out)
