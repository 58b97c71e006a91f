# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launcher below is fully typed.)
"""SiLU-and-mul, the gated MLP activation: [gate | up] -> silu(gate) * up.

Owns one kernel and its launcher; writes only its output, knows no engine. Runs in the scheduler
process, inside the model's forward (dense MLPs and the fused MoE's intermediate).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.triton_util import cast, require_unit_stride, round_to


@triton.jit
def _silu_and_mul_kernel(X, Out, stride_x, stride_o, INTER: tl.constexpr, BLOCK: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < INTER
    gate = tl.load(X + t * stride_x + offs, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(X + t * stride_x + INTER + offs, mask=mask, other=0.0).to(tl.float32)
    # As PyTorch's F.silu(gate) * up: silu rounded to the output dtype, then the product.
    silu = round_to(gate / (1.0 + tl.exp(-gate)), Out.dtype.element_ty)
    tl.store(Out + t * stride_o + offs, cast(silu * up, Out.dtype.element_ty), mask=mask)


def silu_and_mul(x: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """x: [num_tokens, 2 * inter] = [gate | up], last dim contiguous -> [num_tokens, inter].

    fp32 math, output in x's dtype (or out's, if given); silu(gate) is rounded to that dtype
    before the product, as PyTorch's `F.silu(gate) * up` does. out may not alias x.
    """
    num_tokens, two_inter = x.shape
    inter = two_inter // 2
    out = x.new_empty(num_tokens, inter) if out is None else out
    require_unit_stride(x=x, out=out)
    if num_tokens == 0:
        return out
    block = min(triton.next_power_of_2(inter), 1024)
    _silu_and_mul_kernel[(num_tokens, triton.cdiv(inter, block))](
        x, out, x.stride(0), out.stride(0), INTER=inter, BLOCK=block
    )
    return out
