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
model's forward in each scheduler process; the scheduler sets each step's token counts
(`forward_batch.DpAttentionMeta`, with the padding mode) on the batch.
"""

from __future__ import annotations

import torch

from radixserve.engine.distributed import ParallelGroups
from radixserve.engine.forward_batch import DpAttentionMeta


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
