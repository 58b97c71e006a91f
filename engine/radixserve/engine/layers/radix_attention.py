"""RadixAttention: the per-layer attention module; the math lives in the chosen backend.

It knows its heads, head size, scale and layer id, and hands q/k/v together with the
ForwardBatch to `forward_batch.attn_backend`, which reads and writes the paged KV pool. Values
may be narrower than keys (`v_head_dim`): absorbed MLA attends 576-wide latent keys whose first
512 values are the values (layers/mla_attention.py).
"""

from __future__ import annotations

import torch
from torch import nn

from radixserve.engine.forward_batch import ForwardBatch


class RadixAttention(nn.Module):
    def __init__(  # noqa: PLR0913 - the attention geometry has this many facts
        self,
        num_heads: int,
        head_dim: int,
        scaling: float,
        num_kv_heads: int,
        layer_id: int,
        v_head_dim: int | None = None,
    ) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.v_head_dim = v_head_dim or head_dim
        self.scaling = scaling
        self.num_kv_heads = num_kv_heads
        self.layer_id = layer_id

    def forward(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, forward_batch: ForwardBatch
    ) -> torch.Tensor:
        return forward_batch.attn_backend.forward(q, k, v, self, forward_batch)
