"""Vocab-parallel embedding and LM head: the vocabulary is padded to a multiple of tp and
split in contiguous row blocks; the embedding all-reduces masked lookups, the LM head
all-gathers each rank's logits and drops the padding.

Runs in every scheduler process; with a TP group of size 1 these are the plain layers.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.engine.distributed import GroupHandle
from radixserve.engine.model_loader.weight import Weight, read_slice, weight_shape
from radixserve.kernels.cpu.amx_gemm import AmxGemm
from radixserve.kernels.cpu.packed_gemm import PackedWeight, pack_first
from radixserve.kernels.cpu.rowwise_gemm import RowwiseGemm


def padded_vocab_size(vocab_size: int, tp_size: int) -> int:
    return -(-vocab_size // tp_size) * tp_size


class VocabParallelEmbedding(nn.Module):
    """Rows [rank·V_local, (rank+1)·V_local) of the (padded) embedding matrix."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: GroupHandle) -> None:
        super().__init__()
        self.tp = tp
        self.vocab_size = vocab_size
        self.num_local = padded_vocab_size(vocab_size, tp.size) // tp.size
        self.start = tp.rank * self.num_local
        self.weight = nn.Parameter(torch.zeros(self.num_local, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        """input_ids: [T] int64 → [T, hidden]."""
        if self.tp.size == 1:
            return F.embedding(input_ids, self.weight)
        local = input_ids - self.start
        outside = (local < 0) | (local >= self.num_local)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        out.masked_fill_(outside.unsqueeze(-1), 0)
        return self.tp.all_reduce(out)

    def load_full(self, w: Weight, is_bias: bool = False) -> None:
        load_vocab_rows(self.weight, w, self.start, self.vocab_size)


def load_vocab_rows(param: torch.Tensor, w: Weight, start: int, vocab_size: int) -> None:
    """Copy rows [start, start + len(param)) of w; padding rows past the vocabulary stay 0."""
    if weight_shape(w)[0] != vocab_size:
        raise ValueError(f"vocab matrix has {weight_shape(w)[0]} rows, vocab is {vocab_size}")
    n = max(0, min(param.shape[0], vocab_size - start))
    if n:
        param.data[:n].copy_(read_slice(w, 0, start, n))


class ParallelLMHead(nn.Module):
    """hidden → full-vocabulary logits; `tie_to` shares the embedding's shard."""

    weight: nn.Parameter | None
    packed: PackedWeight | None = None
    weight_f32: torch.Tensor | None = None  # CPU without either kernel: see prepack_cpu

    def __init__(
        self,
        vocab_size: int,
        hidden_size: int,
        tp: GroupHandle,
        tie_to: VocabParallelEmbedding | None,
    ) -> None:
        super().__init__()
        self.tp = tp
        self.tied = tie_to is not None
        self.vocab_size = vocab_size
        num_local = padded_vocab_size(vocab_size, tp.size) // tp.size
        self.start = tp.rank * num_local
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.zeros(num_local, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden: [B, hidden] → float32 logits [B, vocab] (all-gathered over the group).

        Float32 whatever the model dtype: a bf16 logit near 16-32 moves in steps of 0.125, so
        near-ties between tokens were common and which one won depended on rounding (a cache
        hit could change a greedy answer)."""
        if self.packed is not None:
            local = self.packed.linear(hidden, out_dtype=torch.float32)
        elif self.weight_f32 is not None:
            local = F.linear(hidden.float(), self.weight_f32)
        else:
            assert self.weight is not None, "weight released by prepack_cpu but not packed"
            local = float32_logits(hidden, self.weight)
        if self.tp.size == 1:
            return local
        return self.tp.all_gather(local, dim=-1)[:, : self.vocab_size]

    def load_full(self, w: Weight, is_bias: bool = False) -> None:
        if self.packed is not None or self.weight_f32 is not None or self.weight is None:
            raise ValueError("the weight was prepacked: load before prepack_cpu")
        load_vocab_rows(self.weight, w, self.start, self.vocab_size)

    def prepack_cpu(self, amx: AmxGemm | None, rowwise: RowwiseGemm | None) -> str | None:
        """Multiply through a packed copy of the (CPU bfloat16) weight: for the AMX kernel,
        which reads it about twice as fast as F.linear for decode batches (docs/benchmarks.md),
        else for the row-invariant kernel; both accumulate in float32 and write float32 logits,
        and each row's logits are the same whatever the batch. Without either (no compiler) a
        float32 copy: torch's CPU matmul has no bf16 → f32 output, and products of bf16 values
        are exact in float32, so it is the same sum unrounded. Loading is over: an untied
        weight is released (no second copy); a tied one stays, as the embedding's. Returns the
        layout ("amx", "rowwise" or "float32"), or None, changing nothing, where the weight is
        already packed or not bfloat16."""
        done = self.packed is not None or self.weight_f32 is not None
        if done or self.weight is None or self.weight.dtype != torch.bfloat16:
            return None
        found = pack_first(self.weight.data, (amx, rowwise))
        if found is not None:
            self.packed, layout = found
        else:
            self.weight_f32, layout = self.weight.data.float(), "float32"
        if not self.tied:
            self.register_parameter("weight", None)
        return layout


def float32_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """hidden · weightᵀ accumulated and returned in float32 for any input dtype: CUDA's
    matmul writes float32 from bf16/fp16 directly; elsewhere both are widened first."""
    if weight.dtype == torch.float32:
        return F.linear(hidden, weight)
    if hidden.is_cuda:
        return torch.mm(hidden, weight.t(), out_dtype=torch.float32)
    return F.linear(hidden.float(), weight.float())
