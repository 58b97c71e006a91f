"""Where each MoE layer's experts live on the EP ranks (SGLang's expert location), and how a
token's choice of a logical expert becomes a physical slot.

A layer has P = num_experts + `--ep-num-redundant-experts` physical slots; EP rank r holds slots
[r·P/ep, (r+1)·P/ep). `physical_to_logical[layer][slot]` is the logical (router) expert a slot
holds. The placement starts trivial (slot i holds expert i mod E), or from
`--init-expert-location` (a map, or recorded counts placed by EPLB), and `--enable-eplb`
replaces it online (model_executor/eplb_manager.py).

Dispatch (SGLang's `dynamic`, rank-invariant form): the k-th (token, choice) row of a forward
that chose expert e, in row order, goes to copy `k mod copies` of e. Every copy of e gets its
share of e's rows to within one, whatever the batch looks like (numbering by token index instead
aliases: with top_k = 2, or prompts whose tokens repeat with an even period, all of an expert's
rows can share a parity and land on one copy), and every rank, seeing the same rows, picks the
same slots. Replicas hold the same
weights, so the placement changes which rank computes a row, never its value.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from radixserve.engine.configs.model_config import ModelConfig
from radixserve.engine.configs.server_args import ServerArgs
from radixserve.engine.layers.eplb_algorithm import mean_balancedness, place_layer, rank_chunks


@dataclass(frozen=True, slots=True)
class LayerPlacement:
    """One layer's slots and the table that turns logical choices into slots."""

    physical_to_logical: tuple[int, ...]
    logical_to_physical: torch.Tensor  # [E, max copies] int64, -1 past each expert's copies
    num_copies: torch.Tensor  # [E] int64, ≥ 1
    is_identity: bool  # slot i holds expert i (no replicas): choices are slots as they are

    @classmethod
    def of(cls, physical_to_logical: Sequence[int], num_experts: int) -> LayerPlacement:
        copies: list[list[int]] = [[] for _ in range(num_experts)]
        for slot, expert in enumerate(physical_to_logical):
            copies[expert].append(slot)
        if missing := [e for e, c in enumerate(copies) if not c]:
            raise ValueError(f"experts {missing[:5]} have no physical slot")
        width = max(len(c) for c in copies)
        table = torch.tensor([c + [-1] * (width - len(c)) for c in copies], dtype=torch.int64)
        counts = torch.tensor([len(c) for c in copies], dtype=torch.int64)
        row = tuple(physical_to_logical)
        return cls(row, table, counts, row == tuple(range(num_experts)))

    @property
    def num_physical(self) -> int:
        return len(self.physical_to_logical)

    def rank_slots(self, rank: int, num_ranks: int) -> tuple[int, ...]:
        """The logical experts of EP rank `rank`'s slots, in slot order."""
        return rank_chunks(self.physical_to_logical, num_ranks)[rank]

    def dispatch(self, logical_ids: torch.Tensor) -> torch.Tensor:
        """[T, top_k] logical expert ids → the physical slots their rows go to."""
        if self.is_identity:
            return logical_ids
        device, flat = logical_ids.device, logical_ids.flatten()
        table, copies = self.logical_to_physical.to(device), self.num_copies.to(device)
        # k-th row choosing expert e (in row order) → copy k mod copies[e]
        order = torch.argsort(flat, stable=True)
        chosen = torch.bincount(flat, minlength=len(copies))
        first = torch.cumsum(chosen, 0) - chosen
        nth = torch.empty_like(flat)
        nth[order] = torch.arange(len(flat), device=device) - first[flat[order]]
        return table[flat, nth % copies[flat]].view_as(logical_ids)


@dataclass(frozen=True, slots=True)
class ExpertLocation:
    """Every layer's placement: physical_to_logical [layers][P] (dense layers included, as
    SGLang keeps them, so the recorder's dumps line up)."""

    physical_to_logical: tuple[tuple[int, ...], ...]
    num_experts: int

    @classmethod
    def trivial(cls, num_layers: int, num_experts: int, num_physical: int) -> ExpertLocation:
        row = tuple(i % num_experts for i in range(num_physical))
        return cls((row,) * num_layers, num_experts)

    @classmethod
    def by_eplb(
        cls, counts: torch.Tensor, num_physical: int, num_ranks: int, num_groups: int = 1
    ) -> ExpertLocation:
        """EPLB over per-layer loads `counts` [layers, E] (or [passes, layers, E], summed)."""
        if counts.dim() == 3:
            counts = counts.sum(0)
        loads = counts.double().tolist()
        rows = tuple(tuple(place_layer(row, num_physical, num_ranks, num_groups)) for row in loads)
        return cls(rows, counts.shape[1])

    def layer(self, layer_id: int) -> LayerPlacement:
        return LayerPlacement.of(self.physical_to_logical[layer_id], self.num_experts)

    def as_tensor(self) -> torch.Tensor:
        return torch.tensor(self.physical_to_logical, dtype=torch.int64)

    def estimated_balancedness(self, counts: torch.Tensor, num_ranks: int) -> float:
        """Mean over layers with traffic of max/mean EP-rank load if loads `counts` [layers, E]
        were dispatched here, each expert's split evenly over its copies (EPLB's model)."""
        slot_loads = []
        for layer_id, row in enumerate(counts.tolist()):
            if any(row):
                placement = self.layer(layer_id)
                copies = placement.num_copies.tolist()
                slot_loads.append([row[e] / copies[e] for e in placement.physical_to_logical])
        return mean_balancedness(slot_loads, num_ranks)


def load_expert_location(
    spec: str,
    num_layers: int,
    num_experts: int,
    num_physical: int,
    num_ranks: int,
    num_groups: int = 1,
) -> ExpertLocation:
    """`--init-expert-location`: trivial; a `.pt` or `.json` file, or inline JSON, holding
    `physical_to_logical_map` [layers, P] (used as given) or `logical_count` ([layers, E], or
    [passes, layers, E] as the recorder dumps it; placed by EPLB). ValueError naming the flag
    for anything else."""
    if spec == "trivial":
        return ExpertLocation.trivial(num_layers, num_experts, num_physical)
    data = _read(spec)
    if "physical_to_logical_map" in data:
        rows = torch.as_tensor(data["physical_to_logical_map"], dtype=torch.int64)
        _expect(rows.shape == (num_layers, num_physical), "physical_to_logical_map", rows.shape,
                (num_layers, num_physical))  # fmt: skip
        bad = (rows < 0) | (rows >= num_experts)
        _expect(not bool(bad.any()), "physical_to_logical_map", "ids", f"in [0, {num_experts})")
        location = ExpertLocation(tuple(tuple(r) for r in rows.tolist()), num_experts)
        for layer_id in range(num_layers):
            try:
                location.layer(layer_id)
            except ValueError as exc:
                raise ValueError(f"init_expert_location: layer {layer_id}: {exc}") from None
        return location
    if "logical_count" in data:
        counts = torch.as_tensor(data["logical_count"], dtype=torch.int64)
        shape = tuple(counts.shape[-2:])
        _expect(counts.dim() in (2, 3) and shape == (num_layers, num_experts), "logical_count",
                tuple(counts.shape), f"[passes,] {num_layers}, {num_experts}")  # fmt: skip
        return ExpertLocation.by_eplb(counts, num_physical, num_ranks, num_groups)
    raise ValueError(
        "init_expert_location: expected trivial, or a .pt / .json file or JSON with "
        "physical_to_logical_map or logical_count"
    )


def expert_location_for(args: ServerArgs, config: ModelConfig, ep_size: int) -> ExpertLocation:
    """The start-up placement of a MoE model over `ep_size` EP ranks: `--init-expert-location`
    over E + `--ep-num-redundant-experts` slots (ValueError naming the flag when it does not
    fit the model)."""
    moe = config.moe
    assert moe is not None
    return load_expert_location(
        args.init_expert_location,
        config.num_hidden_layers,
        moe.num_experts,
        moe.num_experts + args.ep_num_redundant_experts,
        ep_size,
        moe.n_group,
    )


def _read(spec: str) -> dict[str, object]:
    try:
        if spec.lstrip().startswith("{"):
            data = json.loads(spec)
        elif spec.endswith(".pt"):
            data = torch.load(spec, map_location="cpu", weights_only=True)
        else:
            data = json.loads(Path(spec).read_text())
    except (OSError, ValueError, RuntimeError) as exc:
        raise ValueError(f"init_expert_location: cannot read {spec!r}: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"init_expert_location: {spec!r} holds no mapping")
    return data


def _expect(ok: bool, key: str, got: object, want: object) -> None:
    if not ok:
        raise ValueError(f"init_expert_location: {key}: expected {want}, got {got}")
