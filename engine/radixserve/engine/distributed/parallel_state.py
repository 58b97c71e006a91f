"""ParallelGroups: the torch.distributed groups of one engine, built once per scheduler
process from its rank, the world size and a TCP port, then passed down explicitly (ModelRunner
→ models → layers). Nothing here is a module global.

Groups: `world`; `tp` (the whole world: dense MLPs, MoE and shared experts are split over it);
`attn_tp`, the ranks that share one attention (without DP attention the whole world, with it
the tp/dp consecutive ranks of one DP rank) and `attn_dp` (the ranks with the same attention-TP
rank across DP ranks; size dp, or 1); `ep` (expert parallelism: ep_size consecutive ranks, so
tp / ep groups each hold every expert once); `cpu`, a gloo group over the world for control
messages (pool-size agreement, DP attention's per-step token counts) and `attn_cpu`, gloo over
`attn_tp` (the request broadcast of one DP rank). Device groups use NCCL on CUDA and gloo on
the CPU. `moe_a2a_backend` says how MoE layers dispatch tokens over `ep` (none | all_to_all).

NOTE: torch.distributed keeps one ambient default process group per process; it is created
and destroyed only here (`init_parallel_groups` / `destroy_parallel_groups`), one per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from radixserve.engine.configs.rank_spec import RankSpec
from radixserve.engine.distributed.group import GroupHandle

# Peers wait in the CPU broadcast while the server is idle, for as long as it stays idle.
CONTROL_TIMEOUT = timedelta(days=30)


@dataclass(frozen=True, slots=True)
class ParallelGroups:
    world: GroupHandle
    tp: GroupHandle
    attn_tp: GroupHandle
    attn_dp: GroupHandle
    ep: GroupHandle
    cpu: GroupHandle
    attn_cpu: GroupHandle
    device: torch.device = field(default=torch.device("cpu"))
    moe_a2a_backend: str = "none"  # none: all-reduce of local experts' shares | all_to_all

    @classmethod
    def single(cls, device: torch.device | None = None) -> ParallelGroups:
        """One process: every group has size 1 and no collective runs."""
        dev = device or torch.device("cpu")
        one = GroupHandle.single(dev)
        cpu = GroupHandle.single()
        return cls(one, one, one, one, one, cpu, cpu, dev)

    @property
    def dp_attention(self) -> bool:
        """Whether attention is data-parallel (then MLPs gather every DP rank's tokens)."""
        return self.attn_dp.size > 1


def init_parallel_groups(spec: RankSpec, device: torch.device) -> ParallelGroups:
    """Join the rendezvous at spec.host:spec.dist_port and build the groups (collective: every
    rank must call it). tp_size 1 returns `ParallelGroups.single` without torch.distributed."""
    if spec.tp_size == 1:
        return ParallelGroups.single(device)
    backend = "nccl" if device.type == "cuda" else "gloo"
    if device.type == "cuda":
        torch.cuda.set_device(device)
    dist.init_process_group(
        backend,
        init_method=f"tcp://{spec.host}:{spec.dist_port}",
        rank=spec.tp_rank,
        world_size=spec.tp_size,
        timeout=CONTROL_TIMEOUT,
    )
    ranks = list(range(spec.tp_size))
    world = GroupHandle(spec.tp_rank, spec.tp_size, dist.group.WORLD, device)
    cpu_pg = dist.new_group(ranks, backend="gloo", timeout=CONTROL_TIMEOUT)
    cpu = GroupHandle(spec.tp_rank, spec.tp_size, cpu_pg, torch.device("cpu"))
    if spec.attn_dp_size == 1:
        attn_tp, attn_dp, attn_cpu = world, GroupHandle.single(device), cpu
    else:
        attn_tp = _consecutive_group(spec, spec.attn_tp_size, world, device)
        attn_cpu = _consecutive_group(spec, spec.attn_tp_size, cpu, torch.device("cpu"), "gloo")
        attn_dp = _strided_group(spec, spec.attn_tp_size, device)
    ep = _consecutive_group(spec, spec.ep_size, world, device)
    return ParallelGroups(
        world, world, attn_tp, attn_dp, ep, cpu, attn_cpu, device, spec.moe_a2a_backend
    )


def _consecutive_group(
    spec: RankSpec,
    size: int,
    whole: GroupHandle,
    device: torch.device,
    backend: str | None = None,
) -> GroupHandle:
    """Ranks [g·size, (g+1)·size) form group g; every rank creates every group (collective)."""
    if size == 1:
        return GroupHandle.single(device)
    if size == spec.tp_size:
        return whole
    starts = range(0, spec.tp_size, size)
    return _my_group(spec, [list(range(a, a + size)) for a in starts], device, backend)


def _strided_group(spec: RankSpec, stride: int, device: torch.device) -> GroupHandle:
    """Ranks {a, a + stride, a + 2·stride, …} for each a < stride: the attention-DP groups."""
    partition = [list(range(a, spec.tp_size, stride)) for a in range(stride)]
    return _my_group(spec, partition, device)


def _my_group(
    spec: RankSpec, partition: list[list[int]], device: torch.device, backend: str | None = None
) -> GroupHandle:
    """Create one process group per member list (every rank must create all of them, in the
    same order) and return this rank's."""
    mine = GroupHandle.single(device)
    for members in partition:
        pg = dist.new_group(members, timeout=CONTROL_TIMEOUT, backend=backend)
        if spec.tp_rank in members:
            mine = GroupHandle(members.index(spec.tp_rank), len(members), pg, device)
    return mine


def destroy_parallel_groups(groups: ParallelGroups) -> None:
    """Tear down this process's torch.distributed state (no-op for a single process)."""
    if groups.world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
