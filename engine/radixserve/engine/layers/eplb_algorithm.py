"""DeepSeek's expert-parallel load balancer (EPLB), hierarchical form, for one MoE layer: given
each logical expert's load (tokens routed to it), choose the contents of P ≥ E physical expert
slots, replicas of the hottest experts filling the P − E extra ones, and order them so that EP
rank r holds slots [r·P/R, (r+1)·P/R) with loads as even as greedy packing makes them.

The steps, as DeepSeek describes them (SGLang's `deepseek_hierarchical`):

1. Expert groups (`n_group`, the unit of group-limited routing) are packed onto nodes by their
   summed load, so a token's groups stay on one node.
2. Inside each node, its P/nodes slots are filled: one per expert, then each extra slot goes to
   the expert whose load per replica is highest.
3. Each node's replicas (load = expert load / replicas) are packed onto its ranks, exactly P/R
   slots per rank, heaviest first, each onto the lightest rank with room.

One engine replica is one node here (nodes = 1), so step 1 only orders the groups. Pure Python
over lists (a layer has at most a few hundred slots); deterministic, so every rank that feeds it
the same loads gets the same placement. Runs in the scheduler process (model_executor's EPLB
manager) and at start-up (`--init-expert-location`).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def balanced_packing(weights: Sequence[float], num_packs: int) -> list[list[int]]:
    """Item indices split into `num_packs` packs of exactly len(weights) / num_packs items:
    heaviest first, each into the lightest pack with room (ties: the lower index)."""
    n = len(weights)
    if n % num_packs:
        raise ValueError(f"{n} items do not split evenly into {num_packs} packs")
    room = n // num_packs
    packs: list[list[int]] = [[] for _ in range(num_packs)]
    loads = [0.0] * num_packs
    for item in sorted(range(n), key=lambda i: (-weights[i], i)):
        pack = min((p for p in range(num_packs) if len(packs[p]) < room), key=lambda p: loads[p])
        packs[pack].append(item)
        loads[pack] += weights[item]
    return packs


def replicate(loads: Sequence[float], num_slots: int) -> tuple[list[int], list[int]]:
    """Fill `num_slots` ≥ len(loads) slots: one per expert (index order), then each extra slot
    with the expert of the highest load per replica (ties: the lower index). Returns each
    slot's expert and each expert's number of copies."""
    if num_slots < len(loads):
        raise ValueError(f"{num_slots} slots cannot hold {len(loads)} experts")
    slots, counts = list(range(len(loads))), [1] * len(loads)
    for _ in range(num_slots - len(loads)):
        hot = max(range(len(loads)), key=lambda e: (loads[e] / counts[e], -e))
        slots.append(hot)
        counts[hot] += 1
    return slots, counts


def place_layer(
    loads: Sequence[float],
    num_slots: int,
    num_ranks: int,
    num_groups: int = 1,
    num_nodes: int = 1,
) -> list[int]:
    """physical_to_logical for one layer: the logical expert held by each of `num_slots` slots,
    rank r's slots being [r·num_slots/num_ranks, (r+1)·num_slots/num_ranks)."""
    num_experts = len(loads)
    if num_experts % num_groups or num_groups % num_nodes:
        num_groups = num_nodes = 1  # DeepSeek's global policy: groups cannot be kept whole
    if num_slots % num_ranks or num_ranks % num_nodes:
        raise ValueError(f"{num_slots} slots do not split over {num_ranks} ranks")
    group_size = num_experts // num_groups
    group_loads = [sum(loads[g * group_size : (g + 1) * group_size]) for g in range(num_groups)]
    placement: list[int] = []
    for node_groups in balanced_packing(group_loads, num_nodes):
        experts = [g * group_size + i for g in node_groups for i in range(group_size)]
        placement += _place_node(experts, loads, num_slots // num_nodes, num_ranks // num_nodes)
    return placement


def _place_node(
    experts: list[int], loads: Sequence[float], num_slots: int, num_ranks: int
) -> list[int]:
    """Steps 2 and 3 for one node: its experts replicated into `num_slots` slots, packed onto
    its ranks; each rank's slots in the order the packing filled them."""
    node_loads = [loads[e] for e in experts]
    slots, counts = replicate(node_loads, num_slots)
    shares = [node_loads[i] / counts[i] for i in slots]
    return [experts[slots[j]] for pack in balanced_packing(shares, num_ranks) for j in pack]


def rank_chunks(row: Sequence[T], num_ranks: int) -> list[tuple[T, ...]]:
    """A layer's per-slot values split into each EP rank's contiguous, equal share."""
    per_rank = len(row) // num_ranks
    return [tuple(row[r * per_rank : (r + 1) * per_rank]) for r in range(num_ranks)]


def rank_loads(physical_loads: Sequence[float], num_ranks: int) -> list[float]:
    """Sum of each rank's slots' loads (slots split evenly over the ranks, in order)."""
    return [sum(chunk) for chunk in rank_chunks(physical_loads, num_ranks)]


def balancedness(rank_load: Sequence[float]) -> float:
    """max / mean of the ranks' loads: 1.0 is perfect; the busiest rank sets the step time."""
    mean = sum(rank_load) / len(rank_load)
    return max(rank_load) / mean if mean else 1.0


def mean_balancedness(slot_loads: Iterable[Sequence[float]], num_ranks: int) -> float:
    """`balancedness` of each layer's slot loads over the EP ranks, averaged over the layers
    with any load (1.0 when none has)."""
    values = [balancedness(rank_loads(row, num_ranks)) for row in slot_loads if any(row)]
    return sum(values) / len(values) if values else 1.0
