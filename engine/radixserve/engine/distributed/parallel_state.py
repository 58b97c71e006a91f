"""ParallelGroups: the torch.distributed groups of one engine, built once per scheduler
process from its rank, the world size and a TCP port, then passed down explicitly (ModelRunner
→ models → layers). Nothing here is a module global.

Groups: `world`, `tp` (today the whole world), `attn_tp` / `attn_dp` (attention-TP = tp,
attention-DP = 1), `ep` (expert parallelism: ep_size consecutive TP ranks, so tp / ep groups
each hold every expert once), and `cpu`, a gloo group over the same ranks for control messages
(request broadcast, pool-size agreement). Device groups use NCCL on CUDA and gloo on the CPU.
`moe_a2a_backend` says how MoE layers dispatch tokens over `ep` (none | all_to_all).

NOTE: torch.distributed keeps one ambient default process group per process; it is created
and destroyed only here (`init_parallel_groups` / `destroy_parallel_groups`), one per process.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import timedelta

import torch
import torch.distributed as dist

from radixserve.engine.distributed.group import GroupHandle

# Peers wait in the CPU broadcast while the server is idle, for as long as it stays idle.
CONTROL_TIMEOUT = timedelta(days=30)


@dataclass(frozen=True, slots=True)
class RankSpec:
    """Where one scheduler process sits: its TP rank, the TP size, the rendezvous port, the EP
    size (dividing tp_size) and the MoE dispatch mode."""

    tp_rank: int = 0
    tp_size: int = 1
    dist_port: int = 0
    host: str = "127.0.0.1"
    ep_size: int = 1
    moe_a2a_backend: str = "none"

    @property
    def is_first(self) -> bool:
        return self.tp_rank == 0


@dataclass(frozen=True, slots=True)
class ParallelGroups:
    world: GroupHandle
    tp: GroupHandle
    attn_tp: GroupHandle
    attn_dp: GroupHandle
    ep: GroupHandle
    cpu: GroupHandle
    device: torch.device = field(default=torch.device("cpu"))
    moe_a2a_backend: str = "none"  # none: all-reduce of local experts' shares | all_to_all

    @classmethod
    def single(cls, device: torch.device | None = None) -> ParallelGroups:
        """One process: every group has size 1 and no collective runs."""
        dev = device or torch.device("cpu")
        one = GroupHandle.single(dev)
        return cls(one, one, one, GroupHandle.single(dev), GroupHandle.single(dev), one, dev)


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
    one = GroupHandle.single(device)
    ep = _ep_group(spec, world, device)
    return ParallelGroups(world, world, world, one, ep, cpu, device, spec.moe_a2a_backend)


def _ep_group(spec: RankSpec, world: GroupHandle, device: torch.device) -> GroupHandle:
    """Ranks [g·ep, (g+1)·ep) form EP group g; every rank creates every group (collective)."""
    size = spec.ep_size
    if size == 1:
        return GroupHandle.single(device)
    if size == spec.tp_size:
        return world
    mine = GroupHandle.single(device)
    for start in range(0, spec.tp_size, size):
        pg = dist.new_group(list(range(start, start + size)), timeout=CONTROL_TIMEOUT)
        if start <= spec.tp_rank < start + size:
            mine = GroupHandle(spec.tp_rank - start, size, pg, device)
    return mine


def destroy_parallel_groups(groups: ParallelGroups) -> None:
    """Tear down this process's torch.distributed state (no-op for a single process)."""
    if groups.world.size > 1 and dist.is_initialized():
        dist.destroy_process_group()
