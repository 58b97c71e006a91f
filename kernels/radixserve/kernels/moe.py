# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launchers below them are fully typed.)
"""Fused MoE: top-k routing, per-expert sorting and padding, and the grouped expert GEMMs.

Owns the routing kernel, the block alignment (plain torch, no host sync) and one grouped-GEMM
kernel used twice; knows no engine and no parallel layout (EP masks experts before calling).
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

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from radixserve.kernels.activation import silu_and_mul
from radixserve.kernels.layout import TopKOutput
from radixserve.kernels.triton_util import dot, is_interpreted


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


def topk_softmax(router_logits: torch.Tensor, top_k: int, renormalize: bool) -> TopKOutput:
    """Softmax over the experts in fp32, then the top_k largest per token, best first.

    router_logits: [num_tokens, num_experts], any float dtype, last dim contiguous.
    renormalize: divide the chosen weights by their sum (Qwen-MoE's norm_topk_prob).
    Returns TopKOutput(weights [num_tokens, top_k] fp32, ids [num_tokens, top_k] int32).
    """
    num_tokens, num_experts = router_logits.shape
    weights = router_logits.new_empty(num_tokens, top_k, dtype=torch.float32)
    ids = router_logits.new_empty(num_tokens, top_k, dtype=torch.int32)
    if num_tokens:
        _topk_softmax_kernel[(num_tokens,)](
            router_logits, weights, ids, router_logits.stride(0),
            NUM_EXPERTS=num_experts, TOP_K=top_k, BLOCK_E=triton.next_power_of_2(num_experts),
            BLOCK_K=triton.next_power_of_2(top_k), RENORMALIZE=renormalize,
        )  # fmt: skip
    return TopKOutput(weights, ids)


class AlignedRouting(NamedTuple):
    """The (token, choice) rows sorted by expert, each expert's run padded to block_m.

    sorted_ids: [num_blocks * block_m], int32: row t * top_k + j, or T * top_k for padding.
    expert_ids: [num_blocks], int32: the expert of each block, -1 for unused spare blocks.
    block_m: the block size both tensors were built for (the GEMM's BLOCK_M).
    """

    sorted_ids: torch.Tensor
    expert_ids: torch.Tensor
    block_m: int


def moe_align_block_size(topk_ids: torch.Tensor, num_experts: int, block_m: int) -> AlignedRouting:
    """Sort the rows of topk_ids [T, top_k] by expert and pad each expert's run to block_m.

    Plain torch, no host sync: sized for the worst case, T * top_k + num_experts * (block_m - 1)
    rows, so the spare blocks at the end get expert -1 and are skipped by the GEMM.
    """
    flat = topk_ids.flatten().to(torch.int64)
    num_rows = flat.numel()
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + block_m - 1) // block_m * block_m
    order = torch.argsort(flat, stable=True)
    expert_of = flat[order]
    rank = (
        torch.arange(num_rows, device=flat.device) - (torch.cumsum(counts, 0) - counts)[expert_of]
    )
    dest = (torch.cumsum(padded, 0) - padded)[expert_of] + rank
    num_blocks = triton.cdiv(num_rows + num_experts * (block_m - 1), block_m)
    sorted_ids = torch.full(
        (num_blocks * block_m,), num_rows, dtype=torch.int32, device=flat.device
    )
    sorted_ids[dest] = order.to(torch.int32)
    block_ends = torch.cumsum(padded // block_m, 0)
    blocks = torch.arange(num_blocks, device=flat.device)
    expert_ids = torch.searchsorted(block_ends, blocks, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return AlignedRouting(sorted_ids, expert_ids, block_m)


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
    if MUL_WEIGHT:
        w = tl.load(RowWeights + rows, mask=row_mask, other=0.0).to(tl.float32)
        acc = acc * w[:, None]
    tl.store(
        C + rows[:, None] * stride_cm + offs_n[None, :] * stride_cn,
        acc.to(C.dtype.element_ty),
        mask=row_mask[:, None] & n_mask[None, :],
    )


class _Gemm(NamedTuple):
    """One grouped GEMM: out[row] = a[row // a_row_div] @ w[expert]^T (* row weight)."""

    a: torch.Tensor  # [rows of A, K]
    w: torch.Tensor  # [num_experts, N, K]
    out: torch.Tensor  # [T * top_k, N]
    a_row_div: int
    row_weights: torch.Tensor | None  # [T * top_k] fp32, or None


def _grouped_gemm(g: _Gemm, routing: AlignedRouting, upcast: bool) -> None:
    num_experts, n, k = g.w.shape
    block_n, block_k = (32, 16) if upcast else (64, 32)
    grid = (routing.expert_ids.shape[0], triton.cdiv(n, block_n))
    weights = g.out if g.row_weights is None else g.row_weights
    _moe_gemm_kernel[grid](
        g.a, g.w, g.out, routing.sorted_ids, routing.expert_ids, weights,
        n, k, g.out.shape[0],
        g.a.stride(0), g.a.stride(1), g.w.stride(0), g.w.stride(1), g.w.stride(2),
        g.out.stride(0), g.out.stride(1),
        A_ROW_DIV=g.a_row_div, MUL_WEIGHT=g.row_weights is not None,
        BLOCK_M=routing.block_m, BLOCK_N=block_n, BLOCK_K=block_k, UPCAST=upcast,
    )  # fmt: skip


def fused_moe(
    hidden: torch.Tensor,
    w13: torch.Tensor,
    w2: torch.Tensor,
    topk: TopKOutput,
    *,
    block_m: int | None = None,
) -> torch.Tensor:
    """The MoE block: sum_j weight_j * (silu(x Wg_e^T) * (x Wu_e^T)) W2_e^T over e = ids[t, j].

    hidden: [num_tokens, hidden_size], fp32/fp16/bf16. w13: [num_experts, 2 * inter,
    hidden_size], gate rows then up rows (SGLang's w13 layout). w2: [num_experts, hidden_size,
    inter]. topk: from `topk_softmax` (ids int32 < num_experts). block_m: rows per GEMM block
    (16 or 64 by default). Returns [num_tokens, hidden_size] in hidden's dtype; gate_up and the
    intermediate are rounded to hidden's dtype, the weighted sum is fp32.
    """
    num_tokens, hidden_size = hidden.shape
    num_experts, two_inter, _ = w13.shape
    top_k = topk.ids.shape[1]
    num_rows = num_tokens * top_k
    if num_tokens == 0:
        return hidden.new_empty(0, hidden_size)
    upcast = is_interpreted(hidden)
    if block_m is None:
        block_m = 16 if upcast or num_rows <= 16 * num_experts else 64
    routing = moe_align_block_size(topk.ids, num_experts, block_m)
    gate_up = hidden.new_empty(num_rows, two_inter)
    _grouped_gemm(_Gemm(hidden, w13, gate_up, top_k, None), routing, upcast)
    inter = silu_and_mul(gate_up)
    down = hidden.new_empty(num_rows, hidden_size, dtype=torch.float32)
    row_weights = topk.weights.flatten().to(torch.float32)
    _grouped_gemm(_Gemm(inter, w2, down, 1, row_weights), routing, upcast)
    return down.view(num_tokens, top_k, hidden_size).sum(1).to(hidden.dtype)
