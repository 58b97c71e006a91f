# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launchers below them are fully typed.)
"""Fused MoE: top-k routing, per-expert sorting and padding, and the grouped expert GEMMs.

Owns the routing kernel and one grouped-GEMM kernel used twice (the block alignment is plain
torch, in `layout`); knows no engine and no parallel layout (EP masks experts before calling).
Runs in the scheduler process, inside the model's forward.

Algorithm. The T x top_k (token, choice) pairs are numbered row = t * top_k + j. Alignment sorts
the rows by expert and pads each expert's run to a multiple of BLOCK_M with the sentinel
T * top_k, so every block of BLOCK_M sorted rows belongs to one expert (`expert_ids[block]`, -1
for the spare blocks past the end). The grouped GEMM, grid (block, N tile), multiplies the
block's gathered rows of A by that expert's weight: once as hidden[row // top_k] @ w13[e]^T
-> gate_up [T * top_k, 2I] (SiLU-and-mul between), once as inter[row] @ w2[e]^T scaled by the
router weight -> [T * top_k, H] fp32, summed over the top_k choices of each token.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.activation import silu_and_mul
from radixserve.kernels.layout import AlignedRouting, TopKOutput, moe_align_block_size
from radixserve.kernels.triton_util import (
    cast,
    dot,
    is_interpreted,
    require_unit_stride,
    round_to,
)


@triton.jit
def _topk_softmax_kernel(  # noqa: PLR0913 -- a kernel takes every stride as an argument
    Logits, Weights, Ids, stride_l, NUM_EXPERTS: tl.constexpr, TOP_K: tl.constexpr,
    BLOCK_E: tl.constexpr, BLOCK_K: tl.constexpr, RENORMALIZE: tl.constexpr,
):  # fmt: skip
    t = tl.program_id(0).to(tl.int64)
    offs_e = tl.arange(0, BLOCK_E)
    e_mask = offs_e < NUM_EXPERTS
    x = tl.load(Logits + t * stride_l + offs_e, mask=e_mask, other=float("-inf")).to(tl.float32)
    p = tl.exp(x - tl.max(x, 0))
    p = tl.where(e_mask, p / tl.sum(p, 0), -1.0)
    offs_k = tl.arange(0, BLOCK_K)
    weights = tl.zeros([BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(TOP_K):  # k rounds of argmax: top_k is small (<= 8 or so)
        best = tl.argmax(p, 0)
        weights = tl.where(offs_k == j, tl.max(p, 0), weights)
        ids = tl.where(offs_k == j, best.to(tl.int32), ids)
        p = tl.where(offs_e == best, -1.0, p)
    if RENORMALIZE:
        weights = weights / tl.sum(weights, 0)
    k_mask = offs_k < TOP_K
    tl.store(Weights + t * TOP_K + offs_k, weights, mask=k_mask)
    tl.store(Ids + t * TOP_K + offs_k, ids, mask=k_mask)


def topk_softmax(
    router_logits: torch.Tensor, top_k: int, renormalize: bool, out: TopKOutput | None = None
) -> TopKOutput:
    """Softmax over the experts in fp32, then the top_k largest per token, best first.

    router_logits: [num_tokens, num_experts], any float dtype, last dim contiguous.
    renormalize: divide the chosen weights by their sum (Qwen-MoE's norm_topk_prob).
    out: preallocated TopKOutput(weights [num_tokens, top_k] fp32, ids [num_tokens, top_k]
    int32), or None to allocate. Returns it.
    """
    num_tokens, num_experts = router_logits.shape
    require_unit_stride(router_logits=router_logits)
    if out is None:
        weights = router_logits.new_empty(num_tokens, top_k, dtype=torch.float32)
        out = TopKOutput(weights, router_logits.new_empty(num_tokens, top_k, dtype=torch.int32))
    weights, ids = out
    if num_tokens:
        _topk_softmax_kernel[(num_tokens,)](
            router_logits, weights, ids, router_logits.stride(0),
            NUM_EXPERTS=num_experts, TOP_K=top_k, BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=renormalize,
        )  # fmt: skip
    return out


@triton.jit
def _moe_gemm_kernel(  # noqa: PLR0913, PLR0915 -- a kernel takes every stride as an argument
    A, B, C, sorted_ids, expert_ids, RowWeights,
    N, K, num_rows,
    stride_am, stride_ak, stride_be, stride_bn, stride_bk, stride_cm, stride_cn,
    A_ROW_DIV: tl.constexpr, MUL_WEIGHT: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, UPCAST: tl.constexpr,
):  # fmt: skip
    block = tl.program_id(0)
    expert = tl.load(expert_ids + block).to(tl.int64)
    if expert < 0:
        return
    rows = tl.load(sorted_ids + block * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
    row_mask = rows < num_rows
    a_rows = rows // A_ROW_DIV
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        k_mask = offs_k < K
        a = tl.load(
            A + a_rows[:, None] * stride_am + offs_k[None, :] * stride_ak,
            mask=row_mask[:, None] & k_mask[None, :],
            other=0.0,
        )
        b = tl.load(
            B + expert * stride_be + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn,
            mask=k_mask[:, None] & n_mask[None, :],
            other=0.0,
        )
        acc += dot(a, b, UPCAST)
    if MUL_WEIGHT:  # as the PyTorch layer: the expert's output in A's dtype, then weighted
        w = tl.load(RowWeights + rows, mask=row_mask, other=0.0).to(tl.float32)
        acc = round_to(acc, A.dtype.element_ty) * w[:, None]
    tl.store(
        C + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn,
        cast(acc, C.dtype.element_ty),
        mask=row_mask[:, None] & n_mask[None, :],
    )


def grouped_gemm(
    a: torch.Tensor,
    w: torch.Tensor,
    out: torch.Tensor,
    routing: AlignedRouting,
    *,
    a_row_div: int = 1,
    row_weights: torch.Tensor | None = None,
) -> torch.Tensor:
    """out[row] = a[row // a_row_div] @ w[e]^T (* row_weights[row]) for every routed row.

    a: [num_a_rows, K]; w: [num_experts, N, K] (any strides); out: [T * top_k, N], written only
    at the rows `routing` names (all of them for a full routing). e is the expert of the row's
    block. row_weights: [T * top_k] fp32 or None. fp32 accumulation, stored in out's dtype;
    with row_weights the product is rounded to a's dtype before the weight multiplies it.
    """
    num_experts, n, k = w.shape
    require_unit_stride(sorted_ids=routing.sorted_ids, expert_ids=routing.expert_ids,
                        row_weights=row_weights)  # fmt: skip
    upcast = is_interpreted(a)
    block_n, block_k = (32, 16) if upcast else (64, 32)
    grid = (routing.expert_ids.shape[0], triton.cdiv(n, block_n))
    _moe_gemm_kernel[grid](
        a, w, out, routing.sorted_ids, routing.expert_ids,
        out if row_weights is None else row_weights, n, k, out.shape[0],
        a.stride(0), a.stride(1), w.stride(0), w.stride(1), w.stride(2),
        out.stride(0), out.stride(1),
        A_ROW_DIV=a_row_div, MUL_WEIGHT=row_weights is not None,
        BLOCK_M=routing.block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast,
    )  # fmt: skip
    return out


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk: TopKOutput,
    *,
    block_m: int | None = None,
    expert_offset: int | None = None,
    out_fp32: bool = False,
) -> torch.Tensor:
    """The MoE block: sum_j weight_j * (silu(x Wg_e^T) * (x Wu_e^T)) W2_e^T over e = ids[t, j].

    hidden: [num_tokens, hidden_size], fp32/fp16/bf16. w13: [num_experts, 2 * inter,
    hidden_size], gate rows then up rows (SGLang's w13 layout). w2: [num_experts, hidden_size,
    inter]. topk: from `topk_softmax` (ids int32 < num_experts). block_m: rows per GEMM block
    (16 or 64 by default). expert_offset: None when w13/w2 hold every expert the ids name;
    otherwise they hold the global experts [offset, offset + num_experts) (expert
    parallelism) and choices of any other expert add nothing. Returns [num_tokens,
    hidden_size] in hidden's dtype (fp32 with out_fp32); gate_up, the intermediate and each
    expert's output are rounded to hidden's dtype (as the PyTorch layer), the weighted sum is
    fp32.
    """
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    top_k = topk.ids.shape[1]
    num_rows = num_tokens * top_k
    out_dtype = torch.float32 if out_fp32 else hidden.dtype
    if num_tokens == 0:
        return hidden.new_empty(0, hidden_size, dtype=out_dtype)
    if block_m is None:
        block_m = 16 if is_interpreted(hidden) or num_rows <= 16 * num_experts else 64
    if expert_offset is None:
        routing = moe_align_block_size(topk.ids, num_experts, block_m)
        down = hidden.new_empty(num_rows, hidden_size, dtype=torch.float32)
    else:  # other ranks' experts go to one extra expert whose blocks are skipped (left zero)
        local = topk.ids.to(torch.int64) - expert_offset
        local = torch.where((local >= 0) & (local < num_experts), local, num_experts)
        sorted_ids, expert_ids, _ = moe_align_block_size(local, num_experts + 1, block_m)
        expert_ids = torch.where(expert_ids == num_experts, -1, expert_ids)
        routing = AlignedRouting(sorted_ids, expert_ids, block_m)
        down = hidden.new_zeros(num_rows, hidden_size, dtype=torch.float32)
    # Zeros where rows may stay unwritten (other ranks' experts): SiLU then reads no garbage.
    alloc = hidden.new_empty if expert_offset is None else hidden.new_zeros
    gate_up = grouped_gemm(hidden, w13, alloc(num_rows, two_inter), routing, a_row_div=top_k)
    inter = silu_and_mul(gate_up)
    row_weights = topk.weights.flatten().to(torch.float32)
    grouped_gemm(inter, w2, down, routing, row_weights=row_weights)
    return down.view(num_tokens, top_k, hidden_size).sum(1).to(out_dtype)
