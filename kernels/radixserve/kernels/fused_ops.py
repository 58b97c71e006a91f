"""The Triton kernels behind the engine layers' `fused` interface (`fused_ops_protocol`).

`TritonFusedOps` is what the model runner hands every RMSNorm, SiluAndMul, RotaryEmbedding
(and, with the triton attention backend, FusedMoE) module on CUDA. Each op takes CUDA tensors
(CPU tensors too when the kernels run under TRITON_INTERPRET=1, the tests' mode) of fp32,
fp16 or bf16 with a contiguous last dim, and returns None / False for anything else, so the
layer keeps its PyTorch path. The roundings are the PyTorch layers' (see each kernel).
Element-wise per row: under TP / DP attention they act on a rank's local shards unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from radixserve.kernels.activation import silu_and_mul
from radixserve.kernels.layout import TopKOutput
from radixserve.kernels.moe import fused_moe, topk_softmax
from radixserve.kernels.norm import rms_norm
from radixserve.kernels.rotary import rotary_tables_
from radixserve.kernels.triton_util import interpreted

DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def _takes(*tensors: torch.Tensor) -> bool:
    """Same supported dtype and device (CUDA, or the CPU under the interpreter), last dim
    contiguous."""
    first = tensors[0]
    on_device = first.is_cuda or (first.is_cpu and interpreted())
    return (
        on_device
        and first.dtype in DTYPES
        and all(
            t.device == first.device and t.dtype == first.dtype and t.stride(-1) == 1
            for t in tensors
        )
    )


@dataclass(frozen=True)
class TritonFusedOps:
    """Stateless: one instance serves every module of a model."""

    def rmsnorm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weight · norm(x + residual), x + residual) as fresh tensors, or (weight · norm(x),
        x) without a residual; x, residual [rows, h], weight [h]. None where not taken."""
        if x.dim() != 2 or weight.shape != (x.shape[1],) or not _takes(x, weight):
            return None
        if residual is not None and not (residual.shape == x.shape and _takes(x, residual)):
            return None
        if residual is None:
            return rms_norm(x, weight, eps).out, x
        out, summed = torch.empty((2, *x.shape), dtype=x.dtype, device=x.device).unbind(0)
        rms_norm(x, weight, eps, residual, out=out, residual_out=summed)
        return out, summed

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(x[:, :d]) · x[:, d:] for x [rows, 2d], or None where x is not taken."""
        if x.dim() != 2 or x.shape[1] % 2 or not _takes(x):
            return None
        return silu_and_mul(x)

    def rotary_(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> bool:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by cos/sin [T, 1, D] (rotate-half
        form, the whole head). False, touching nothing, where the tensors are not taken."""
        if q.dim() != 3 or k.dim() != 3 or not _takes(q, k, cos, sin):
            return False
        tokens, _, d = q.shape
        tables_ok = all(t.shape in ((tokens, 1, d), (tokens, d)) for t in (cos, sin))
        if not (tables_ok and d % 2 == 0 and k.shape[0] == tokens and k.shape[2] == d):
            return False
        rotary_tables_(q, k, cos, sin)
        return True

    def select_experts(
        self, router_logits: torch.Tensor, top_k: int, renormalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """fp32 softmax over the experts, the top_k best first (renormalised if asked):
        (weights fp32, ids int64) [T, top_k]; None where the logits are not taken."""
        if router_logits.dim() != 2 or not _takes(router_logits):
            return None
        weights, ids = topk_softmax(router_logits, top_k, renormalize)
        return weights, ids.to(torch.int64)

    def moe_f32(
        self,
        hidden: torch.Tensor,
        w13: torch.Tensor,
        w2: torch.Tensor,
        weights: torch.Tensor,
        ids: torch.Tensor,
        expert_start: int,
        num_experts: int,
    ) -> torch.Tensor | None:
        """The fused MoE (`moe.fused_moe`) of the experts w13 [E, 2I, H] / w2 [E, H, I] hold,
        the global experts [expert_start, expert_start + E) of num_experts: fp32 [T, H]."""
        if hidden.dim() != 2 or not (_takes(hidden, w13, w2) and ids.device == hidden.device):
            return None
        local = w13.shape[0]
        offset = None if (expert_start == 0 and local == num_experts) else expert_start
        topk = TopKOutput(weights.to(torch.float32), ids.to(torch.int32))
        return fused_moe(hidden, w13, w2, topk, expert_offset=offset, out_fp32=True)
