"""DpAttentionMeta: one step's token counts of every DP rank, carried by the ForwardBatch.

The scheduler exchanges the counts each step (`scheduler.dp_attention_sync`) and sets them on
the batch; `layers.dp_attention`'s gather and scatter read them inside the model's forward.
The padding mode is SGLang's DP padding choice: how the gather moves the rows, never what
it returns.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

PaddingMode = Literal["sum_len", "max_len"]


@dataclass(frozen=True, slots=True)
class DpAttentionMeta:
    """One step's token counts of every DP rank (the same on every rank of the world)."""

    dp_rank: int
    num_tokens: tuple[int, ...]  # per DP rank
    mode: PaddingMode

    @classmethod
    def create(cls, dp_rank: int, num_tokens: tuple[int, ...], any_extend: bool) -> DpAttentionMeta:
        return cls(dp_rank, num_tokens, choose_padding_mode(num_tokens, any_extend))

    @property
    def total(self) -> int:
        return sum(self.num_tokens)

    @property
    def local(self) -> slice:
        """This DP rank's rows in the global batch."""
        start = sum(self.num_tokens[: self.dp_rank])
        return slice(start, start + self.num_tokens[self.dp_rank])


def choose_padding_mode(num_tokens: tuple[int, ...], any_extend: bool) -> PaddingMode:
    """max_len (all-gather) for decode-only steps whose padding at most doubles the bytes;
    sum_len (all-reduce) otherwise: prefill counts differ widely between DP ranks."""
    if any_extend:
        return "sum_len"
    return "max_len" if max(num_tokens) * len(num_tokens) <= 2 * sum(num_tokens) else "sum_len"
