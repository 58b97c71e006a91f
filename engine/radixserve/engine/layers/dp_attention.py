"""DP attention: attention runs on each DP rank's own tokens (its attention-TP group), the MLP
or MoE on every DP rank's tokens at once over the whole TP group.

Before a decoder layer's MLP, `dp_gather` builds the global token batch [sum of every DP rank's
tokens, H] on every rank; after it, `dp_scatter` keeps this DP rank's rows. Two ways to gather,
as SGLang's DP padding modes, both exact (the chosen mode changes only how many bytes move):

- `sum_len`: a zero buffer of the global length in which attention-TP rank 0 of each DP rank
  writes its tokens at its offset, then an all-reduce over the world (other ranks add zeros).
- `max_len`: every rank pads its tokens to the longest DP rank's count and all-gathers; the
  rows of each DP rank's attention-TP rank 0 are kept. Cheaper when DP ranks carry similar
  counts (decode), so it is chosen for decode-only steps whose padding stays small.

The MLP's row-parallel output is all-reduced over the world before the scatter, so every rank
holds the full sum (a reduce-scatter would move fewer bytes; the result is the same). Ranks
without work run IDLE batches of 0 tokens: they still join every collective. Runs inside the
model's forward in each scheduler process; the scheduler fills `DpAttentionMeta` each step.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from radixserve.engine.distributed import ParallelGroups

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


def dp_gather(hidden: torch.Tensor, meta: DpAttentionMeta, groups: ParallelGroups) -> torch.Tensor:
    """[this DP rank's T, H] → [every DP rank's tokens, H], in DP rank order, on every rank."""
    world = groups.world
    if meta.mode == "max_len":
        longest = max(meta.num_tokens)
        padded = hidden.new_zeros((longest, hidden.shape[1]))
        padded[: hidden.shape[0]] = hidden
        every = world.all_gather(padded, dim=0).view(world.size, longest, -1)
        heads = every[:: groups.attn_tp.size]  # attention-TP rank 0 of each DP rank
        return torch.cat([heads[d, :n] for d, n in enumerate(meta.num_tokens)], dim=0)
    out = hidden.new_zeros((meta.total, hidden.shape[1]))
    if groups.attn_tp.is_first:
        out[meta.local] = hidden
    return world.all_reduce(out)


def dp_scatter(hidden: torch.Tensor, meta: DpAttentionMeta) -> torch.Tensor:
    """[every DP rank's tokens, H] (the same on every rank) → this DP rank's rows."""
    return hidden[meta.local]
