"""LogitsProcessor: picks the hidden state of each request's last new token (of every token
in a speculative verify) and applies the LM head. Logits are returned in float32 whatever the
model dtype, for stable sampling.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixserve.engine.forward_batch import ForwardBatch
from radixserve.engine.layers.vocab_parallel import ParallelLMHead


@dataclass(frozen=True, slots=True)
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [B, V] float32
    # [T, hidden] the final (normed) hidden state of every new token, where captured: what an
    # EAGLE draft head reads with the next token
    hidden_states: torch.Tensor | None = None


class LogitsProcessor(nn.Module):
    """`capture_hidden`: also return every new token's hidden state (EAGLE's target and head)."""

    def __init__(self, capture_hidden: bool = False) -> None:
        super().__init__()
        self.capture_hidden = capture_hidden

    def forward(
        self, hidden: torch.Tensor, lm_head: ParallelLMHead, forward_batch: ForwardBatch
    ) -> LogitsProcessorOutput:
        """hidden: [T, hidden] for all new tokens of the batch. A verify's logits are those of
        every position ([T, V]: each draft is checked against its own)."""
        mode = forward_batch.forward_mode
        if mode.is_decode() or mode.is_target_verify():
            last = hidden
        else:
            ends = torch.tensor(forward_batch.extend_seq_lens_cpu, device=hidden.device).cumsum(0)
            last = hidden[ends - 1]
        return LogitsProcessorOutput(lm_head(last), hidden if self.capture_hidden else None)
