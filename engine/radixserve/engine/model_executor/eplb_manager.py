"""Online expert rebalancing (`--enable-eplb`, SGLang's EPLBManager): every
`--eplb-rebalance-num-iterations` forward passes, the recorder's counts since the last rebalance
are placed by EPLB (layers/eplb_algorithm.py) and the experts move to their new slots
(layers/expert_mover.py), `--eplb-rebalance-layers-per-chunk` layers after each following pass
(all at once by default).

Why it is safe: it runs on the forward thread right after a forward ends, so no forward reads the
weights while they move. Every rank of an EP group runs the same forwards (TP ranks schedule the
same batches; DP attention ranks join every MoE with IDLE batches when they have none), so all
count the same passes and reach the same rebalance together. The counts come from the EP group's
first rank (a broadcast), so all compute the same placement. A layer's weights and its dispatch
table change together, so a forward sees each layer wholly before or wholly after its move; the
placement never changes what a token computes, only which rank computes it.

Runs in the scheduler process (ModelRunner.forward calls `on_forward_end`).
"""

from __future__ import annotations

import logging
import time

import msgspec
from torch import nn

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.distributed import GroupHandle
from radixserve.engine.ipc.messages import ExpertLoad
from radixserve.engine.layers.eplb_algorithm import mean_balancedness
from radixserve.engine.layers.expert_distribution import ExpertDistributionRecorder
from radixserve.engine.layers.expert_location import ExpertLocation, LayerPlacement
from radixserve.engine.layers.expert_mover import move_experts
from radixserve.engine.layers.moe import SparseMoeBlock

logger = logging.getLogger(__name__)


class EPLBManager:
    def __init__(
        self,
        blocks: list[SparseMoeBlock],
        recorder: ExpertDistributionRecorder,
        location: ExpertLocation,
        ep: GroupHandle,
        num_iterations: int,
        layers_per_chunk: int | None = None,
        num_groups: int = 1,
    ) -> None:
        self.blocks = {b.layer_id: b for b in blocks}
        self.recorder, self.location, self.ep = recorder, location, ep
        self.num_iterations = num_iterations
        self.layers_per_chunk = layers_per_chunk or len(self.blocks)
        self.num_groups = num_groups
        self.passes = 0
        self.rebalances = 0  # completed
        self.moved_layers = 0
        self.move_seconds = 0.0
        self.max_move_seconds = 0.0
        self._pending: list[int] = []  # layers still to move to `self._target`
        self._target: ExpertLocation | None = None
        recorder.start()

    def on_forward_end(self) -> None:
        self.passes += 1
        if self._pending:
            self._move_chunk()
        elif self.passes % self.num_iterations == 0:
            self._plan()

    def _plan(self) -> None:
        """Place the window's counts by EPLB; queue the layers whose slots change."""
        logical, _ = self.recorder.dump()  # [passes, layers, E]; no pass sums to zeros
        counts = self.ep.broadcast(logical.sum(0).to(self.ep.device)).cpu()
        if int(counts.sum()) == 0:
            return  # no traffic since the last one: nothing to balance by
        num_physical = len(self.location.physical_to_logical[0])
        target = ExpertLocation.by_eplb(counts, num_physical, self.ep.size, self.num_groups)
        old, new = self.location.physical_to_logical, target.physical_to_logical
        self._pending = [i for i in sorted(self.blocks) if old[i] != new[i]]
        self._target = target
        before = self.location.estimated_balancedness(counts, self.ep.size)
        after = target.estimated_balancedness(counts, self.ep.size)
        logger.info(
            "eplb_rebalance layers=%d balancedness_before=%.3f balancedness_after=%.3f",
            len(self._pending), before, after,
        )  # fmt: skip
        if self._pending:
            self._move_chunk()

    def _move_chunk(self) -> None:
        assert self._target is not None
        start = time.perf_counter()
        chunk, self._pending = (
            self._pending[: self.layers_per_chunk],
            self._pending[self.layers_per_chunk :],
        )
        rows = list(self.location.physical_to_logical)
        for layer_id in chunk:
            block, new = self.blocks[layer_id], self._target.physical_to_logical[layer_id]
            move_experts(block.experts, rows[layer_id], new, self.ep)
            block.placement = LayerPlacement.of(new, self.location.num_experts)
            rows[layer_id] = new
        self.location = ExpertLocation(tuple(rows), self.location.num_experts)
        seconds = time.perf_counter() - start
        self.moved_layers += len(chunk)
        self.move_seconds += seconds
        self.max_move_seconds = max(self.max_move_seconds, seconds)
        if not self._pending:
            self.rebalances += 1
        logger.info("eplb_moved layers=%s seconds=%.4f left=%d", chunk, seconds, len(self._pending))


def attach_expert_balancing(
    model: nn.Module,
    args: ServerArgs,
    config: ModelConfig,
    location: ExpertLocation | None,
    ep: GroupHandle,
) -> tuple[ExpertDistributionRecorder | None, EPLBManager | None]:
    """The recorder every MoE block reports to (`--expert-distribution-recorder-mode`, and
    always under `--enable-eplb`) and the online EPLB manager; None where not asked for."""
    moe = config.moe
    wanted = args.expert_distribution_recorder_mode is not None or args.enable_eplb
    if moe is None or not wanted:
        return None, None
    num_physical = len(location.physical_to_logical[0]) if location is not None else None
    buffer = args.expert_distribution_recorder_buffer_size
    if args.enable_eplb and buffer != -1:  # the window between rebalances must fit
        buffer = max(buffer, args.eplb_rebalance_num_iterations)
    recorder = ExpertDistributionRecorder(
        config.num_hidden_layers, moe.num_experts, buffer, num_physical
    )
    blocks = [m for m in model.modules() if isinstance(m, SparseMoeBlock)]
    for block in blocks:
        block.recorder = recorder
    if not args.enable_eplb or location is None:
        return recorder, None
    manager = EPLBManager(
        blocks, recorder, location, ep, args.eplb_rebalance_num_iterations,
        args.eplb_rebalance_layers_per_chunk, moe.n_group,
    )  # fmt: skip
    return recorder, manager


def expert_load(
    recorder: ExpertDistributionRecorder | None, eplb: EPLBManager | None, ep_size: int
) -> ExpertLoad | None:
    """The load snapshot's expert balance (None without the recorder)."""
    if recorder is None:
        return None
    passes, slots = recorder.window()
    out = ExpertLoad(mean_balancedness(slots.tolist(), ep_size), passes)
    if eplb is None:
        return out
    return msgspec.structs.replace(
        out,
        rebalances=eplb.rebalances,
        moved_layers=eplb.moved_layers,
        move_seconds=eplb.move_seconds,
        max_move_seconds=eplb.max_move_seconds,
    )
