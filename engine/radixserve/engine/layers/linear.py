"""A plain, unsharded linear layer: every rank holds the whole weight.

Used for the two small MoE gates in layers/moe.py (the expert router and the shared-expert
gate). The projections that tensor parallelism splits, including the fused q/k/v and gate/up
ones, are in layers/parallel_linear.py.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Linear(nn.Module):
    """y = x Wᵀ + b with W: [out, in]."""

    def __init__(self, input_size: int, output_size: int, bias: bool = False) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(output_size, input_size), requires_grad=False)
        self.bias = nn.Parameter(torch.zeros(output_size), requires_grad=False) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)
