"""Mixture-of-experts MLP in plain PyTorch: router top-k, tokens grouped by expert, one
SiLU-gated MLP per expert, weighted combine; plus Qwen2-MoE's sigmoid gate on a shared expert;
and expert parallelism, how one layer's tokens reach the EP ranks holding their experts.

Owns the stacked expert weights (`w13 [E_local, 2I, H]` = gate rows then up rows,
`w2 [E_local, H, I]`, the layout the Triton fused-MoE kernel takes) and their loading from
per-expert checkpoint tensors. It is the reference that kernel is measured against. FusedMoE knows
no parallel layout: an `ExpertRange` says which experts it holds (default all); the others'
share of a token is left out, for expert parallelism (`ep_moe_forward`, which SparseMoeBlock
calls) to sum across ranks. Runs in the scheduler process, inside the model's forward.

Algorithm. The T x top_k (token, choice) pairs are numbered row = t * top_k + j and sorted by
expert (stable); each expert's contiguous run of rows gathers its tokens, runs
silu(x Wg^T) * (x Wu^T) W2^T once, scales each row by its router weight and adds it into the
token's output. Experts with no tokens are skipped; a token never picks one expert twice
(top-k indices are distinct). On CUDA with the triton attention backend the model runner sets
`FusedMoE.fused` (`radixserve.kernels.fused_ops.TritonFusedOps`): the router's top-k and the
experts then run as Triton kernels (sorted, block-padded rows; grouped GEMMs; weighted combine)
with this code's roundings, and this code stays the path elsewhere.

Expert parallelism. The EP group's ranks each hold a contiguous `ExpertRange`
(`ExpertRange.for_rank`). The hidden states entering the layer are the same on every rank of
the group (tensor parallelism replicates them). Two dispatch modes, as SGLang's
`--moe-a2a-backend`:

- `none`: every rank runs its local experts on all tokens (choices of other ranks' experts add
  nothing), then a float32 all-reduce over the group sums the shares.
- `all_to_all`: rank r takes its contiguous slice of the tokens, sends each (token, choice) row
  only to the rank owning that expert (`all_to_all_single`: counts first, then rows and expert
  ids), runs the rows it received through its experts, sends the results back the same way,
  combines them weighted by the router, and an all-reduce of the slices rebuilds every token.

Both give the sum of the same per-expert outputs in expert order, so they agree with each
other and with one process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from radixserve.engine.configs.model_config import MoEConfig
from radixserve.engine.distributed import GroupHandle
from radixserve.engine.layers.activation import SiluAndMul
from radixserve.engine.layers.expert_distribution import ExpertDistributionRecorder
from radixserve.engine.layers.expert_location import LayerPlacement
from radixserve.engine.layers.linear import Linear
from radixserve.engine.layers.moe_router import MoEGate, TopKOutput, select_experts

__all__ = ["ExpertRange", "FusedMoE", "SparseMoeBlock", "TopKOutput", "select_experts"]
from radixserve.kernels.fused_ops_protocol import FusedMoeOps

# Which third of an expert a checkpoint tensor is: w1 = gate, w3 = up, w2 = down (Mixtral's
# names; Qwen's gate_proj / up_proj / down_proj map onto them).
ExpertShard = Literal["w1", "w2", "w3"]


class ExpertRange(NamedTuple):
    """Global expert ids [start, end) held by one module (expert parallelism: a rank's slice)."""

    start: int
    end: int

    @property
    def num_local(self) -> int:
        return self.end - self.start

    def holds(self, expert_id: int) -> bool:
        return self.start <= expert_id < self.end

    @classmethod
    def for_rank(cls, num_experts: int, ep: GroupHandle) -> ExpertRange:
        """EP rank r's experts: the r-th of ep.size equal contiguous slices."""
        if num_experts % ep.size:
            raise ValueError(
                f"ep_size: {ep.size} does not divide the model's {num_experts} experts"
            )
        per_rank = num_experts // ep.size
        return cls(ep.rank * per_rank, (ep.rank + 1) * per_rank)


class FusedMoE(nn.Module):
    """The routed experts of one layer, stacked: w13_weight, w2_weight (HF's [out, in] each).

    Its ids are physical slots: `num_experts` of them, `expert_range` held here, slot i holding
    logical expert `slot_experts[i - start]` (the same id without EPLB replicas)."""

    def __init__(
        self,
        num_experts: int,
        hidden_size: int,
        intermediate_size: int,
        expert_range: ExpertRange | None = None,
        slot_experts: Sequence[int] | None = None,
    ) -> None:
        super().__init__()
        rng = expert_range or ExpertRange(0, num_experts)
        if not 0 <= rng.start < rng.end <= num_experts:
            raise ValueError(f"expert range {tuple(rng)} is not inside [0, {num_experts})")
        self.num_experts, self.expert_range = num_experts, rng
        # The logical (checkpoint) expert each held slot holds: the slot ids themselves unless
        # EPLB placed replicas (layers/expert_location.py); the EPLB manager rewrites it.
        self.slot_experts = tuple(slot_experts or range(rng.start, rng.end))
        if len(self.slot_experts) != rng.num_local:
            raise ValueError(f"{len(self.slot_experts)} slot experts for {rng.num_local} slots")
        self.intermediate_size = intermediate_size
        local = rng.num_local
        self.w13_weight = nn.Parameter(
            torch.empty(local, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.w2_weight = nn.Parameter(
            torch.empty(local, hidden_size, intermediate_size), requires_grad=False
        )
        self.act = SiluAndMul()
        # The Triton fused MoE (routing and experts), set by the model runner on CUDA with the
        # triton attention backend; None keeps the PyTorch code below (and it is the oracle).
        self.fused: FusedMoeOps | None = None

    def forward(self, hidden: torch.Tensor, topk: TopKOutput) -> torch.Tensor:
        """hidden [T, H] → [T, H] (hidden's dtype): Σ over each token's local top-k experts of
        weight × expert(x). Choices of experts outside `expert_range` add nothing."""
        return self.forward_f32(hidden, topk).to(hidden.dtype)

    def forward_f32(self, hidden: torch.Tensor, topk: TopKOutput) -> torch.Tensor:
        """`forward` before the cast back: the float32 sum, for ranks to add up exactly."""
        if self.fused is not None:
            start, w13, w2 = self.expert_range.start, self.w13_weight, self.w2_weight
            out = self.fused.moe_f32(hidden, w13, w2, *topk, start, self.num_experts)
            if out is not None:
                return out
        top_k = topk.ids.shape[1]
        out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
        flat_weights = topk.weights.reshape(-1)
        for expert_id, expert_rows in self._grouped(topk.ids.reshape(-1)):
            tokens = expert_rows // top_k
            y = self._expert(expert_id - self.expert_range.start, hidden[tokens])
            out.index_add_(0, tokens, y.float() * flat_weights[expert_rows, None])
        return out

    def forward_rows(self, rows: torch.Tensor, expert_ids: torch.Tensor) -> torch.Tensor:
        """Row i of rows [n, H] through expert `expert_ids[i]` (global ids, all held here),
        unweighted: [n, H]. The receiving side of the all-to-all dispatch."""
        out = torch.empty_like(rows)
        for expert_id, idx in self._grouped(expert_ids):
            out[idx] = self._expert(expert_id - self.expert_range.start, rows[idx])
        return out

    def _grouped(self, flat_ids: torch.Tensor) -> list[tuple[int, torch.Tensor]]:
        """(expert id, positions in flat_ids choosing it, ascending) for each held expert with
        any; experts in ascending order."""
        rows = torch.argsort(flat_ids, stable=True)
        counts = torch.bincount(flat_ids, minlength=self.num_experts).tolist()
        groups, start = [], 0
        for expert_id, count in enumerate(counts):
            expert_rows, start = rows[start : start + count], start + count
            if count and self.expert_range.holds(expert_id):
                groups.append((expert_id, expert_rows))
        return groups

    def _expert(self, local_id: int, x: torch.Tensor) -> torch.Tensor:
        """One expert's SiLU-gated MLP on its tokens: x [n, H] → [n, H]."""
        gate_up = F.linear(x, self.w13_weight[local_id])
        return F.linear(self.act(gate_up), self.w2_weight[local_id])

    def load_expert(self, expert_id: int, shard: ExpertShard, tensor: torch.Tensor) -> bool:
        """Copy one expert's gate (w1), up (w3) or down (w2) checkpoint matrix into its slot.

        `expert_id` is the checkpoint's (logical) id; every slot holding it gets a copy.
        Returns False, copying nothing, for an expert this module does not hold.
        """
        slots = [i for i, e in enumerate(self.slot_experts) if e == expert_id]
        inter = self.intermediate_size
        for local in slots:
            target = {
                "w1": self.w13_weight.data[local, :inter],
                "w3": self.w13_weight.data[local, inter:],
                "w2": self.w2_weight.data[local],
            }[shard]
            if target.shape != tensor.shape:
                raise ValueError(
                    f"expert {expert_id} {shard}: checkpoint shape {tuple(tensor.shape)} ≠ "
                    f"model {tuple(target.shape)}"
                )
            target.copy_(tensor)
        return bool(slots)

    def holds_expert(self, expert_id: int) -> bool:
        """Whether any slot here holds logical expert `expert_id`."""
        return expert_id in self.slot_experts

    def load_stacked(
        self, name: Literal["gate_up_proj", "down_proj"], tensor: torch.Tensor
    ) -> None:
        """transformers 5's in-memory layout: all experts in one tensor ([E, 2I, H] gate then up,
        or [E, H, I]); only this module's experts are copied."""
        target = self.w13_weight if name == "gate_up_proj" else self.w2_weight
        part = tensor[list(self.slot_experts)]
        if target.shape != part.shape:
            raise ValueError(f"experts.{name}: checkpoint shape {tuple(tensor.shape)} ≠ model")
        target.data.copy_(part)


def ep_moe_forward(
    experts: FusedMoE,
    hidden: torch.Tensor,
    topk: TopKOutput,
    ep: GroupHandle,
    backend: str = "none",
) -> torch.Tensor:
    """hidden [T, H] (same on every EP rank) → the routed experts' weighted sum [T, H]."""
    if ep.size == 1:
        return experts(hidden, topk)
    if backend == "all_to_all":
        out = _all_to_all(experts, hidden, topk, ep)
    else:
        out = experts.forward_f32(hidden, topk)
    return ep.all_reduce(out).to(hidden.dtype)


def _token_slice(num_tokens: int, ep: GroupHandle) -> slice:
    """This rank's share of the tokens it dispatches: contiguous, sizes differing by ≤ 1."""
    return slice(ep.rank * num_tokens // ep.size, (ep.rank + 1) * num_tokens // ep.size)


def _all_to_all(
    experts: FusedMoE, hidden: torch.Tensor, topk: TopKOutput, ep: GroupHandle
) -> torch.Tensor:
    """float32 [T, H]: this rank's token slice combined, zero elsewhere (the caller sums)."""
    mine = _token_slice(hidden.shape[0], ep)
    ids, weights = topk.ids[mine], topk.weights[mine]
    top_k = ids.shape[1]
    flat_ids = ids.reshape(-1)
    order = torch.argsort(flat_ids, stable=True)  # by expert, hence by owning rank
    per_rank = experts.num_experts // ep.size
    send = torch.bincount(flat_ids // per_rank, minlength=ep.size)
    recv = ep.all_to_all(send, [1] * ep.size, [1] * ep.size)
    send_counts, recv_counts = send.tolist(), recv.tolist()
    tokens = order // top_k
    rows = ep.all_to_all(hidden[mine][tokens], send_counts, recv_counts)
    row_experts = ep.all_to_all(flat_ids[order], send_counts, recv_counts)
    done = ep.all_to_all(experts.forward_rows(rows, row_experts), recv_counts, send_counts)
    out = torch.zeros(hidden.shape, dtype=torch.float32, device=hidden.device)
    scaled = done.float() * weights.reshape(-1)[order, None]
    out[mine].index_add_(0, tokens, scaled)
    return out


class SparseMoeBlock(nn.Module):
    """The MoE MLP of one decoder layer: `gate` (the router, `moe_router.MoEGate`), `experts`,
    and optionally a `shared_expert` (any dense MLP module [T, H] → [T, H], built by the model)
    every token passes through, scaled by sigmoid(`shared_expert_gate` · x) where the config
    gates it (Qwen2-MoE; DeepSeek's shared experts are added as they are).

    Under expert parallelism (`ep` of size > 1) this rank holds its `ExpertRange.for_rank`
    slice of the layer's slots and `a2a_backend` (none | all_to_all, `ep_moe_forward`) joins the
    ranks' shares. With an EPLB `placement` there are E + redundant slots, each holding the
    logical expert the placement names; the router's choices become slots before dispatch.
    """

    def __init__(
        self,
        moe: MoEConfig,
        hidden_size: int,
        shared_expert: nn.Module | None = None,
        ep: GroupHandle | None = None,
        a2a_backend: str = "none",
        layer_id: int = 0,
        placement: LayerPlacement | None = None,
    ) -> None:
        super().__init__()
        self.moe = moe
        self.layer_id = layer_id
        # --expert-distribution-recorder-mode: set by the model runner (expert_distribution.py)
        self.recorder: ExpertDistributionRecorder | None = None
        self.ep, self.a2a_backend = ep or GroupHandle.single(), a2a_backend
        # EPLB's slots (layers/expert_location.py): None is slot e = expert e. The EPLB manager
        # swaps it, with the weights, between two forward passes.
        self.placement = placement
        num_slots, slot_experts, expert_range = moe.num_experts, None, None
        if placement is not None:
            num_slots = placement.num_physical
            slot_experts = placement.rank_slots(self.ep.rank, self.ep.size)
        if self.ep.size > 1:
            expert_range = ExpertRange.for_rank(num_slots, self.ep)
        self.gate = MoEGate(moe, hidden_size)
        self.experts = FusedMoE(
            num_slots, hidden_size, moe.moe_intermediate_size, expert_range, slot_experts
        )
        self.shared_expert = shared_expert
        gated = shared_expert is not None and moe.shared_expert_gated
        self.shared_expert_gate = Linear(hidden_size, 1, bias=False) if gated else None

    def select(self, hidden: torch.Tensor) -> TopKOutput:
        """Each token's experts as physical slots (the choices and the slots reported to the
        recorder, if any)."""
        topk = self._select(hidden)
        slots = None if self.placement is None else self.placement.dispatch(topk.ids)
        if self.recorder is not None:  # without a placement the slots are the choices
            self.recorder.on_select(self.layer_id, topk.ids, slots)
        return topk if slots is None else TopKOutput(topk.weights, slots)

    def _select(self, hidden: torch.Tensor) -> TopKOutput:
        """The fused top-k where it implements the config's routing, else the router's."""
        fused, moe = self.experts.fused, self.moe
        if fused is not None and moe.plain_routing:
            chosen = fused.select_experts(self.gate(hidden), moe.top_k, moe.norm_topk_prob)
            if chosen:
                return TopKOutput(*chosen)
        return self.gate.route(hidden)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """hidden [T, H] → [T, H]."""
        out = ep_moe_forward(self.experts, hidden, self.select(hidden), self.ep, self.a2a_backend)
        if self.shared_expert is None:
            return out
        shared = self.shared_expert(hidden)
        if self.shared_expert_gate is not None:
            shared = torch.sigmoid(self.shared_expert_gate(hidden)) * shared
        return out + shared
