"""The interface the engine's norm / activation / rotary / MoE layers take as `fused`.

Two implementations: `radixserve.kernels.cpu.fused_ops.CpuFusedOps` (C++, CPU tensors) and
`radixserve.kernels.fused_ops.TritonFusedOps` (Triton, CUDA tensors). Every op returns None
(False for the in-place rotary) for tensors it does not take, touching nothing, and the layer
then runs its PyTorch code. Triton-free, so the CPU engine imports it without triton.
"""

from __future__ import annotations

from typing import Protocol

import torch


class FusedOps(Protocol):
    def rmsnorm(
        self,
        x: torch.Tensor,
        weight: torch.Tensor,
        eps: float,
        residual: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weight · norm(x + residual), x + residual), or (weight · norm(x), x)."""
        ...

    def silu_and_mul(self, x: torch.Tensor) -> torch.Tensor | None:
        """silu(x[:, :d]) · x[:, d:] for x [rows, 2d]."""
        ...

    def rotary_(
        self, q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> bool:
        """Rotate q [T, Hq, D] and k [T, Hkv, D] in place by cos/sin [T, 1, D]."""
        ...


class FusedMoeOps(Protocol):
    def select_experts(
        self, router_logits: torch.Tensor, top_k: int, renormalize: bool
    ) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(weights [T, top_k] fp32, ids [T, top_k] int64), best first: softmax then top-k."""
        ...

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
        """Σ_j weights[t, j] · expert_{ids[t, j]}(hidden[t]) in fp32 [T, H] over the choices
        of the experts w13/w2 hold (global ids expert_start + local index)."""
        ...
