"""Linear layers, including fused ones that load several checkpoint tensors as shards.

Fusing q/k/v and gate/up halves the number of matmuls per layer, which matters on CPU.
Tensor parallelism will slice these along their output (column) or input (row) dimension.
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


class MergedLinear(Linear):
    """Several projections of the same input stacked along the output dimension."""

    def __init__(self, input_size: int, output_sizes: list[int], bias: bool = False) -> None:
        super().__init__(input_size, sum(output_sizes), bias)
        self.output_sizes = list(output_sizes)
        self.offsets = [sum(output_sizes[:i]) for i in range(len(output_sizes))]

    def load_shard(self, shard: int, tensor: torch.Tensor, is_bias: bool) -> None:
        start, size = self.offsets[shard], self.output_sizes[shard]
        target = self.bias if is_bias else self.weight
        if target is None:
            raise ValueError("checkpoint has a bias for a projection built without one")
        if tensor.shape[0] != size:
            raise ValueError(
                f"shard {shard}: expected {size} rows, checkpoint has {tensor.shape[0]}"
            )
        target.data[start : start + size].copy_(tensor)
