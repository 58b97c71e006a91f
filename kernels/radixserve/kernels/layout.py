"""The layouts the kernels read: paged KV views, new tokens, MoE routing; their index builders.

Owns only plain containers and plain-torch index builders, shared by kernels and references;
imports no triton and no engine. Runs in the scheduler process, as part of the model's forward.

NOTE: KV indices are always per token (one pool slot id per cached token, as in SGLang's triton
backend), whatever the page size. With page size P a request's slots come in page-aligned runs
(`slot = page_id * P + offset`), so page size 16 needs no kernel change: only the allocator
decides which slots a request owns, and `req_to_token` already holds per-token slots.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch


@dataclass(frozen=True, slots=True)
class PagedKv:
    """The KV pool of one layer and the slots each request of a batch reads.

    k_buffer: [num_slots, num_kv_heads, head_dim], fp32/fp16/bf16 (slot 0 is the padding slot).
    v_buffer: [num_slots, num_kv_heads, v_head_dim], same dtype and device.
    kv_indptr: [batch + 1], int32: request i reads kv_indices[kv_indptr[i]:kv_indptr[i + 1]].
    kv_indices: [kv_indptr[-1]], int32 or int64: pool slot of each cached token, in order.
    """

    k_buffer: torch.Tensor
    v_buffer: torch.Tensor
    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor

    @property
    def batch_size(self) -> int:
        return int(self.kv_indptr.shape[0]) - 1


@dataclass(frozen=True, slots=True)
class RaggedKv:
    """The new tokens of an extend batch, dense and concatenated request after request.

    k: [num_new_tokens, num_kv_heads, head_dim]; v: [num_new_tokens, num_kv_heads, v_head_dim].
    qo_indptr: [batch + 1], int32: request i owns rows qo_indptr[i]:qo_indptr[i + 1] of q, k, v.
    max_len: the longest request's number of new tokens (sizes the launch grid; no device sync).
    """

    k: torch.Tensor
    v: torch.Tensor
    qo_indptr: torch.Tensor
    max_len: int


class KvIndices(NamedTuple):
    """kv_indptr [batch + 1] int32 and kv_indices [kv_indptr[-1]] int32 (see `PagedKv`)."""

    kv_indptr: torch.Tensor
    kv_indices: torch.Tensor


class NormOutput(NamedTuple):
    """out: the normed rows [T, hidden]; residual: x + residual [T, hidden] (None if not given)."""

    out: torch.Tensor
    residual: torch.Tensor | None


class RotaryOutput(NamedTuple):
    """The rotated query [T, num_heads, head_dim] and key [T, num_kv_heads, head_dim]."""

    q: torch.Tensor
    k: torch.Tensor


class TopKOutput(NamedTuple):
    """weights: [T, top_k] fp32 router weights; ids: [T, top_k] int32 expert ids, best first."""

    weights: torch.Tensor
    ids: torch.Tensor


def build_kv_indices(
    req_to_token: torch.Tensor, req_pool_indices: torch.Tensor, seq_lens: torch.Tensor
) -> KvIndices:
    """Flatten each request's first `seq_len` slots of `req_to_token` into (kv_indptr, kv_indices).

    req_to_token: [num_rows, max_context_len], int32: (request row, position) -> pool slot.
    req_pool_indices: [batch], int64: each request's row. seq_lens: [batch], int64/int32.
    Returns kv_indptr [batch + 1] int32 and kv_indices [sum(seq_lens)] int32. Reads
    `seq_lens.max()` on the host (one sync); a CUDA-graph path would need a kernel instead.
    """
    lens = seq_lens.to(torch.int64)
    kv_indptr = torch.zeros(lens.shape[0] + 1, dtype=torch.int32, device=seq_lens.device)
    kv_indptr[1:] = torch.cumsum(lens, 0).to(torch.int32)
    max_len = int(lens.max().item()) if lens.numel() else 0
    rows = req_to_token[req_pool_indices.to(torch.int64), :max_len]
    mask = torch.arange(max_len, device=seq_lens.device)[None, :] < lens[:, None]
    return KvIndices(kv_indptr, rows[mask].to(torch.int32))


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
    num_blocks = -(-(num_rows + num_experts * (block_m - 1)) // block_m)
    sorted_ids = torch.full(
        (num_blocks * block_m,), num_rows, dtype=torch.int32, device=flat.device
    )
    sorted_ids[dest] = order.to(torch.int32)
    block_ends = torch.cumsum(padded // block_m, 0)
    blocks = torch.arange(num_blocks, device=flat.device)
    expert_ids = torch.searchsorted(block_ends, blocks, right=True)
    expert_ids = torch.where(expert_ids < num_experts, expert_ids, -1).to(torch.int32)
    return AlignedRouting(sorted_ids, expert_ids, block_m)
