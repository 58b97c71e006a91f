"""Token embedding and the LM head (which may share the embedding's weight)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.engine.layers.vocab_parallel import float32_logits


class VocabEmbedding(nn.Module):
    def __init__(self, vocab_size: int, hidden_size: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return F.embedding(input_ids, self.weight)


class LMHead(nn.Module):
    """hidden → vocabulary logits. With `tie_to`, reuses the embedding matrix."""

    def __init__(self, vocab_size: int, hidden_size: int, tie_to: VocabEmbedding | None) -> None:
        super().__init__()
        if tie_to is not None:
            self.weight = tie_to.weight
        else:
            self.weight = nn.Parameter(torch.empty(vocab_size, hidden_size), requires_grad=False)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Float32 logits whatever the dtype (see ParallelLMHead.forward)."""
        return float32_logits(hidden, self.weight)
