"""Moving one MoE layer's expert weights between EP ranks to a new placement (online EPLB).

Every rank knows the old and the new `physical_to_logical` row, so every rank derives the same
plan: rank d needs each logical expert of its new slots that none of its old slots holds; the
lowest rank that holds it now sends it. One all-to-all over the EP group carries those experts
(gate, up and down matrices flattened into one row each); the rest are copied from the rank's
own old slots, and a slot that repeats an expert reuses the one row. The new weights are
written in place, so the parameters (and anything holding them) stay the same tensors.

Costs one layer's local experts in extra memory while it runs. Runs in the scheduler process,
between two forward passes (model_executor/eplb_manager.py), on every rank of the EP group.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from radixserve.engine.distributed import GroupHandle
from radixserve.engine.layers.eplb_algorithm import rank_chunks
from radixserve.engine.layers.moe import FusedMoE


def move_experts(
    experts: FusedMoE, old: Sequence[int], new: Sequence[int], ep: GroupHandle
) -> None:
    """Refill this rank's slots from placement `old` to `new` (collective over `ep`, skipped
    on every rank alike when no rank needs another's expert)."""
    before, after = rank_chunks(old, ep.size), rank_chunks(new, ep.size)
    source: dict[int, int] = {}
    for rank in reversed(range(ep.size)):
        source.update((e, rank) for e in before[rank])  # the lowest holder wins
    needs = [sorted(set(after[r]) - set(before[r])) for r in range(ep.size)]
    w13, w2 = experts.w13_weight.data, experts.w2_weight.data
    flat = torch.cat([w13.flatten(1), w2.flatten(1)], dim=1)
    rows = {e: flat[i] for i, e in reversed(list(enumerate(before[ep.rank])))}
    if any(needs):
        me = ep.rank
        send = [[e for e in needs[d] if source[e] == me] for d in range(ep.size)]
        recv = [[e for e in needs[me] if source[e] == r] for r in range(ep.size)]
        outgoing = [rows[e] for part in send for e in part]
        payload = torch.stack(outgoing) if outgoing else flat[:0]
        got = ep.all_to_all(payload, [len(p) for p in send], [len(p) for p in recv])
        rows.update(zip([e for part in recv for e in part], got, strict=True))
    refilled = torch.stack([rows[e] for e in after[ep.rank]])
    split = w13[0].numel()
    w13.copy_(refilled[:, :split].view_as(w13))
    w2.copy_(refilled[:, split:].view_as(w2))
    experts.slot_experts = after[ep.rank]
