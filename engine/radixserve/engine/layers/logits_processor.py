"""LogitsProcessor: picks the hidden state of each request's last new token (of every token
in a speculative verify) and applies the LM head. Logits are returned in float32 whatever the
model dtype, for stable sampling. Prompt log-probabilities, where a request asks for them, are
reduced here block by block, so a long prompt never holds [T, V] logits at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from radixserve.engine.forward_batch import ForwardBatch, InputLogprobRows
from radixserve.engine.layers.vocab_parallel import ParallelLMHead
from radixserve.engine.sampling import top_logprobs_of

# Prompt rows put through the LM head at a time: 256 × SmolLM2's 49,152 ids is 50 MB of
# float32 logits and their log-softmax.
INPUT_LOGPROB_BLOCK = 256


@dataclass(frozen=True, slots=True)
class InputLogprobValues:
    """The raw log-probability of each prompt row's next prompt token, and its row's best."""

    token_logprobs: torch.Tensor  # [R] float32
    top_logprobs: list[list[tuple[float, int]]]  # per row, best (logprob, id) first; [] if top_k 0


@dataclass(frozen=True, slots=True)
class LogitsProcessorOutput:
    next_token_logits: torch.Tensor  # [B, V] float32
    # [T, hidden] the final (normed) hidden state of every new token, where captured: what an
    # EAGLE draft head reads with the next token
    hidden_states: torch.Tensor | None = None
    input_logprobs: InputLogprobValues | None = None  # where the batch asked for them


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
        wanted = forward_batch.input_logprobs
        return LogitsProcessorOutput(
            lm_head(last),
            hidden if self.capture_hidden else None,
            None if wanted is None else input_logprobs(hidden, lm_head, wanted),
        )


def input_logprobs(
    hidden: torch.Tensor, lm_head: ParallelLMHead, wanted: InputLogprobRows
) -> InputLogprobValues:
    """Raw log-probabilities (no temperature or penalty: OpenAI's and SGLang's prompt
    logprobs) of each wanted row's next prompt token, and the row's `top_k` best."""
    token_parts: list[torch.Tensor] = []
    tops: list[list[tuple[float, int]]] = []
    rows = wanted.rows.to(hidden.device)
    targets = wanted.targets.to(hidden.device)
    for start in range(0, rows.numel(), INPUT_LOGPROB_BLOCK):
        block = slice(start, start + INPUT_LOGPROB_BLOCK)
        logprobs = torch.log_softmax(lm_head(hidden[rows[block]]), dim=-1)
        token_parts.append(logprobs.gather(1, targets[block].unsqueeze(1)).squeeze(1))
        tops += top_logprobs_of(logprobs, [wanted.top_k] * logprobs.shape[0]) or []
    empty = hidden.new_empty(0, dtype=torch.float32)
    return InputLogprobValues(torch.cat(token_parts) if token_parts else empty, tops)
