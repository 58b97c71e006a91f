"""RMSNorm with an optional fused residual add (the decoder-layer calling convention)."""

from __future__ import annotations

import torch
from torch import nn


class RMSNorm(nn.Module):
    def __init__(self, hidden_size: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size))
        self.eps = eps

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
        if residual is not None:
            x = x + residual
        return self._norm(x), x

    def forward_plain(self, x: torch.Tensor) -> torch.Tensor:
        """Norm without residual (q/k norms, final norm where no residual exists)."""
        return self._norm(x)
