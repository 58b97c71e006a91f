"""Tensor-parallel linear layers: column-parallel (output rows split over the TP group,
including fused gate/up and q/k/v) and row-parallel (input columns split, partial sums
all-reduced). Each loads its own slice of the full checkpoint tensor.

Runs in every scheduler process; with a TP group of size 1 these are the plain layers.
Shard map of the fused q/k/v: rank r holds q heads [r·H/tp, (r+1)·H/tp) and KV heads
[r·K/tp, …) when K ≥ tp, else the one KV head r // (tp/K) (replicated over tp/K ranks).

On a CPU in bfloat16 the model runner packs each weight once at load (`prepack_cpu`): into
the tile order of our AMX kernel (kernels/cpu/amx_gemm.cpp) where the CPU has AMX-BF16 and the
shape fits, else into oneDNN's blocked layout, as torch inductor's CPU freezing and vLLM's CPU
backend do (F.linear would reorder the weight on every call; same oneDNN kernels, bit-identical
results). The AMX kernel reads the weights about twice as fast as oneDNN for decode batches
(docs/benchmarks.md); it accumulates in float32 and rounds once, as oneDNN does, and for
decode shapes in oneDNN's order (bit-identical outputs measured; tests hold it to a bound).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.engine.distributed import GroupHandle
from radixserve.engine.model_loader.weight import Weight, read_slice, weight_shape
from radixserve.kernels.cpu.amx_gemm import AmxGemm
from radixserve.kernels.cpu.packed_gemm import PackedWeight, pack_first
from radixserve.kernels.cpu.rowwise_gemm import RowwiseGemm

# oneDNN picks its blocked layout for a batch size; one layout serves every batch. Measured
# (docs/benchmarks.md): packed for 256 rows it is faster than per-call reordering from 1 to
# 256 rows and even at 1024.
PACK_BATCH_HINT = 256


def onednn_bf16_supported() -> bool:
    """Whether oneDNN's bf16 linear runs on this CPU: torch's own check (AVX-512 BW/VL/DQ or
    AVX-NE-CONVERT). Elsewhere (an AVX2-only CPU) its reorder raises, so the weight stays for
    F.linear."""
    return bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())


def can_prepack(weight: torch.Tensor) -> bool:
    """A CPU bfloat16 weight where torch has oneDNN (the prepacked op needs both)."""
    return (
        weight.device.type == "cpu"
        and weight.dtype == torch.bfloat16
        and torch.backends.mkldnn.is_available()
    )


class _Prepackable(nn.Module):
    """The packed-weight slot shared by both layers, and the projection through it."""

    weight: nn.Parameter | None
    packed: torch.Tensor | PackedWeight | None = None

    def prepack_cpu(
        self, amx: AmxGemm | None = None, rowwise: RowwiseGemm | None = None
    ) -> str | None:
        """Replace the weight by its packed copy, for `amx` where given and the shape fits,
        else for `rowwise` where given (deterministic inference: its rows are batch-invariant,
        oneDNN's are not), else for oneDNN where the CPU runs its bf16 path (no second copy is
        kept: loading is over). Returns the layout used, "amx", "rowwise" or "onednn", or None,
        changing nothing, where the weight cannot be packed."""
        if self.weight is None or self.packed is not None or not can_prepack(self.weight):
            return None
        found = pack_first(self.weight.data, (amx, rowwise))
        if found is not None:
            self.packed, layout = found
        elif onednn_bf16_supported():
            self.packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.data, PACK_BATCH_HINT)
            layout = "onednn"
        else:
            return None
        self.register_parameter("weight", None)
        return layout

    def _project(self, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        if isinstance(self.packed, PackedWeight):
            return self.packed.linear(x, bias)
        if self.packed is not None:
            return torch.ops.mkldnn._linear_pointwise(x, self.packed, bias, "none", [], "")
        assert self.weight is not None, "weight released by prepack_cpu but no packed weight"
        return F.linear(x, self.weight, bias)


@dataclass(frozen=True, slots=True)
class KVHeadLayout:
    num_local_heads: int  # KV heads this rank holds (≥ 1)
    first_head: int  # global index of its first KV head


def kv_head_layout(num_kv_heads: int, tp: GroupHandle) -> KVHeadLayout:
    """Split KV heads over the group, or replicate them when there are fewer than ranks."""
    if num_kv_heads >= tp.size:
        local = num_kv_heads // tp.size
        return KVHeadLayout(local, tp.rank * local)
    return KVHeadLayout(1, tp.rank // (tp.size // num_kv_heads))


def _copy_rows(target: torch.Tensor, start: int, w: Weight, src_start: int, n: int) -> None:
    if weight_shape(w)[0] < src_start + n:
        raise ValueError(f"checkpoint tensor has {weight_shape(w)[0]} rows, need {src_start + n}")
    target.data[start : start + n].copy_(read_slice(w, 0, src_start, n))


class ColumnParallelLinear(_Prepackable):
    """y_local = x W_localᵀ (+ b_local); W_local: [output/tp, in]. Output stays sharded."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool, tp: GroupHandle):
        super().__init__()
        self.tp = tp
        # Per shard: (local rows, first row of this rank in the checkpoint tensor)
        self.shards = [(size // tp.size, tp.rank * (size // tp.size)) for size in output_sizes]
        self._init(input_size, bias)

    def _init(self, input_size: int, bias: bool) -> None:
        rows = sum(n for n, _ in self.shards)
        self.offsets = [sum(n for n, _ in self.shards[:i]) for i in range(len(self.shards))]
        self.weight = nn.Parameter(torch.empty(rows, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(rows), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self._project(x, self.bias)

    def load_shard(self, shard: int, w: Weight, is_bias: bool) -> None:
        """Copy this rank's rows of checkpoint projection `shard` (q/k/v, gate/up index)."""
        target = self.bias if is_bias else self.weight
        if target is None:
            raise ValueError(
                "checkpoint has a bias for a projection built without one "
                "(or the weight was already prepacked)"
            )
        n, src = self.shards[shard]
        _copy_rows(target, self.offsets[shard], w, src, n)

    def load_full(self, w: Weight, is_bias: bool) -> None:
        self.load_shard(0, w, is_bias)


class QKVParallelLinear(ColumnParallelLinear):
    """Fused q/k/v projection: q heads split, KV heads split or replicated (KVHeadLayout)."""

    def __init__(  # noqa: PLR0913 - the attention geometry has this many facts
        self,
        hidden_size: int,
        head_dim: int,
        num_heads: int,
        num_kv_heads: int,
        bias: bool,
        tp: GroupHandle,
    ) -> None:
        nn.Module.__init__(self)
        self.tp = tp
        q_local = num_heads // tp.size
        kv = kv_head_layout(num_kv_heads, tp)
        q = (q_local * head_dim, tp.rank * q_local * head_dim)
        k = (kv.num_local_heads * head_dim, kv.first_head * head_dim)
        self.shards = [q, k, k]
        self._init(hidden_size, bias)


class RowParallelLinear(_Prepackable):
    """y = all_reduce(x_local W_localᵀ) + b; W_local: [out, in/tp], x_local sharded likewise."""

    def __init__(self, input_size: int, output_size: int, bias: bool, tp: GroupHandle) -> None:
        super().__init__()
        self.tp = tp
        self.local_in = input_size // tp.size
        self.weight = nn.Parameter(torch.empty(output_size, self.local_in), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(output_size), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.tp.all_reduce(self._project(x, None))
        return out + self.bias if self.bias is not None else out

    def load_full(self, w: Weight, is_bias: bool) -> None:
        if is_bias:  # added once, after the reduction
            assert self.bias is not None
            self.bias.data.copy_(read_slice(w, 0, 0, weight_shape(w)[0]))
            return
        start = self.tp.rank * self.local_in
        if self.weight is None:
            raise ValueError("the weight was prepacked: load before prepack_cpu")
        self.weight.data.copy_(read_slice(w, 1, start, self.local_in))
