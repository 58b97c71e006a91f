"""DpAttentionSync: before every step under DP attention, the DP ranks tell each other how many
tokens their batch carries and whether it extends (one small all-gather over the world's CPU
group), so that every rank runs the same forward collectives: a rank without a batch runs an
IDLE forward of 0 tokens whenever another DP rank has work, and nobody runs a forward when all
are idle. Runs in the scheduler process, called by the Scheduler each step.
"""

from __future__ import annotations

import torch

from radixserve.engine.distributed import ParallelGroups
from radixserve.engine.forward_batch import DpAttentionMeta
from radixserve.engine.scheduler.schedule_batch import ScheduleBatch


class DpAttentionSync:
    def __init__(self, groups: ParallelGroups) -> None:
        self.cpu = groups.cpu
        self.attn_tp_size = groups.attn_tp.size
        self.dp_rank = groups.attn_dp.rank
        self.busy = False  # whether any DP rank had work at the last exchange

    def exchange(self, batch: ScheduleBatch | None) -> DpAttentionMeta | None:
        """Collective over the world: every DP rank's token count for this step, or None when
        no DP rank has a batch (then nobody runs a forward)."""
        tokens = len(batch.input_ids) if batch is not None else 0
        extend = batch is not None and batch.forward_mode.is_extend_like()
        mine = torch.tensor([tokens, int(extend)], dtype=torch.int64)
        every = self.cpu.all_gather(mine, dim=0).view(-1, 2)[:: self.attn_tp_size]
        counts = tuple(int(n) for n in every[:, 0].tolist())
        self.busy = any(counts)
        if not self.busy:
            return None
        return DpAttentionMeta.create(self.dp_rank, counts, bool(every[:, 1].any()))
