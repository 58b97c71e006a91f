"""RMSNorm with an optional fused residual add (the decoder-layer calling convention).

The model runner hands every norm a fused op (`fused`): the C++ one on the CPU
(`radixserve.kernels.cpu.fused_ops`), the Triton one on CUDA with the triton or flashinfer
backend (`radixserve.kernels.fused_ops`): one pass per row instead of six PyTorch ops, the
same roundings. The PyTorch code below serves where the op declines a tensor or none is set
(`--disable-fused-ops`), and is the ops' oracle.
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.kernels.fused_ops_protocol import FusedOps


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps
        self.fused: FusedOps | None = None  # set by the model runner (CPU / CUDA ops)

    def _norm(self, x: torch.Tensor) -> torch.Tensor:
        # Normalise in float32 like the HF reference, then cast back before the weight.
        dtype = x.dtype
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(dtype)

    def forward(
        self, x: torch.Tensor, residual: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """x, residual: [num_tokens, hidden]. Returns (norm(x + residual), x + residual)."""
        if self.fused is not None:
            out = self.fused.rmsnorm(x, self.weight, self.eps, residual)
            if out is not None:
                return out
        if residual is not None:
            x = x + residual
        return self._norm(x), x

    def forward_plain(self, x: torch.Tensor) -> torch.Tensor:
        """Norm without residual (q/k norms, final norm where no residual exists)."""
        return self._norm(x)
