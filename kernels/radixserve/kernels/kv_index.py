# mypy: disable-error-code="no-untyped-def, untyped-decorator"
# (Triton kernels are untyped by nature: @triton.jit is untyped and tl.constexpr is their only
# annotation; the launcher below is fully typed.)
"""Device-side kv-index builder: req_to_token rows -> kv_indptr / kv_indices, no host sync.

Owns one kernel and its launcher; writes only the two index tensors, knows no engine. Runs in
the scheduler process when the attention backend plans a batch; unlike `build_kv_indices` it
reads no length on the host, so it can be captured in a CUDA graph (buffers sized up front).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from radixserve.kernels.layout import KvIndices
from radixserve.kernels.triton_util import is_interpreted, require_unit_stride


@triton.jit
def _fill_kv_indices_kernel(  # noqa: PLR0913 -- a kernel takes every stride as an argument
    ReqToToken, ReqPoolIndices, SeqLens, KvIndptr, KvIndices, stride_row,
    BLOCK: tl.constexpr,
):  # fmt: skip
    b = tl.program_id(0)
    row = tl.load(ReqPoolIndices + b).to(tl.int64)
    seq_len = tl.load(SeqLens + b)
    start = tl.load(KvIndptr + b)
    for n0 in range(0, seq_len, BLOCK):
        offs = n0 + tl.arange(0, BLOCK)
        mask = offs < seq_len
        slot = tl.load(ReqToToken + row * stride_row + offs, mask=mask)
        tl.store(KvIndices + start + offs, slot.to(KvIndices.dtype.element_ty), mask=mask)


def fill_kv_indices(
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    seq_lens: torch.Tensor,
    kv_indices: torch.Tensor | None = None,
) -> KvIndices:
    """The `build_kv_indices` result, computed on the device without a host sync.

    req_to_token: [num_rows, max_context_len], int32, last dim contiguous. req_pool_indices:
    [batch] int64; seq_lens: [batch] int32/int64. kv_indices: a preallocated int32 buffer of at
    least sum(seq_lens) entries (for graphs: the worst case), or None to allocate exactly
    (which syncs once for the size). Returns KvIndices(kv_indptr [batch + 1] int32, kv_indices);
    entries past sum(seq_lens) of a preallocated buffer are left as they were.
    """
    batch = seq_lens.shape[0]
    require_unit_stride(req_to_token=req_to_token, req_pool_indices=req_pool_indices,
                        seq_lens=seq_lens, kv_indices=kv_indices)  # fmt: skip
    kv_indptr = torch.zeros(batch + 1, dtype=torch.int32, device=seq_lens.device)
    kv_indptr[1:] = torch.cumsum(seq_lens, 0).to(torch.int32)
    if kv_indices is None:
        kv_indices = seq_lens.new_empty(int(kv_indptr[-1].item()), dtype=torch.int32)
    if batch:
        _fill_kv_indices_kernel[(batch,)](
            req_to_token, req_pool_indices, seq_lens, kv_indptr, kv_indices, req_to_token.stride(0),
            BLOCK=16 if is_interpreted(seq_lens) else 512,
        )  # fmt: skip
    return KvIndices(kv_indptr, kv_indices)
