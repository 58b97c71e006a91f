"""SiLU-and-multiply: the gated MLP activation over a fused [gate | up] projection.

The model runner hands it a fused op (`fused`: C++ on the CPU, Triton on CUDA with the
triton/flashinfer backends): one pass instead of three PyTorch ops and two temporaries, the
same roundings; PyTorch serves where none is set or the op declines the tensor.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.kernels.fused_ops_protocol import FusedOps


class SiluAndMul(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fused: FusedOps | None = None  # set by the model runner (CPU / CUDA ops)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: [num_tokens, 2 * d] → [num_tokens, d]."""
        if self.fused is not None:
            out = self.fused.silu_and_mul(x)
            if out is not None:
                return out
        d = x.shape[-1] // 2
        return F.silu(x[..., :d]) * x[..., d:]
