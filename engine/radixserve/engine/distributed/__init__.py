"""Process groups of one engine (world, TP, attention-TP/DP, EP, CPU control group)."""

from __future__ import annotations

from radixserve.engine.configs.rank_spec import RankSpec
from radixserve.engine.distributed.group import GroupHandle
from radixserve.engine.distributed.parallel_state import (
    ParallelGroups,
    destroy_parallel_groups,
    init_parallel_groups,
)

__all__ = [
    "GroupHandle",
    "ParallelGroups",
    "RankSpec",
    "destroy_parallel_groups",
    "init_parallel_groups",
]
