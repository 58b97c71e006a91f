"""EPLB's placement (layers/eplb_algorithm.py, layers/expert_location.py) against DeepSeek's own
published example, and the placement's dispatch: a replicated expert's tokens spread evenly over
its copies, every slot named holds the chosen expert, and `--init-expert-location` refuses a map
or a dump that does not fit the model, naming the flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from radixserve.engine.layers.eplb_algorithm import balancedness, place_layer, rank_loads
from radixserve.engine.layers.expert_location import (
    ExpertLocation,
    LayerPlacement,
    load_expert_location,
)

# github.com/deepseek-ai/EPLB README: two layers of 12 experts in 4 groups, 16 slots on
# 2 nodes × 4 GPUs, and the phy2log its hierarchical policy prints
README_LOADS = [
    [90, 132, 40, 61, 104, 165, 39, 4, 73, 56, 183, 86],
    [20, 107, 104, 64, 19, 197, 187, 157, 172, 86, 16, 27],
]
README_PHY2LOG = [
    [5, 6, 5, 7, 8, 4, 3, 4, 10, 9, 10, 2, 0, 1, 11, 1],
    [7, 10, 6, 8, 6, 11, 8, 9, 2, 4, 5, 1, 5, 0, 3, 1],
]


def test_placement_is_deepseeks_published_example() -> None:
    for loads, want in zip(README_LOADS, README_PHY2LOG, strict=True):
        assert place_layer(loads, 16, 8, num_groups=4, num_nodes=2) == want


def test_a_skewed_layer_is_balanced_over_the_ranks() -> None:
    """Two hot experts of 16 on 4 ranks: the trivial placement puts both on rank 0 (max/mean
    3.7). Without copies the best is one hot expert per rank (max/mean 2.02); each extra slot
    goes to a hot expert, and the ranks even out as copies are added."""
    loads = [1000, 900] + [10] * 14
    assert balancedness(rank_loads(loads, 4)) > 3.7
    after = []
    for redundant in (0, 4, 8):
        placement = ExpertLocation.by_eplb(torch.tensor([loads]), 16 + redundant, 4).layer(0)
        copies = placement.num_copies.tolist()
        assert sorted(set(placement.physical_to_logical)) == list(range(16))
        assert copies[0] + copies[1] == 2 + redundant  # every extra slot copies a hot expert
        shares = [loads[e] / copies[e] for e in placement.physical_to_logical]
        after.append(balancedness(rank_loads(shares, 4)))
    assert after[0] == pytest.approx(1030 / 510)
    assert after[0] > after[1] > after[2]


def test_dispatch_spreads_a_replicated_expert_over_its_copies() -> None:
    placement = LayerPlacement.of([0, 1, 2, 3, 0, 0, 1, 3], num_experts=4)
    ids = torch.tensor([[0, 1]] * 30 + [[2, 0]] * 30)
    slots = placement.dispatch(ids)
    held = torch.tensor(placement.physical_to_logical)
    assert torch.equal(held[slots], ids)  # every slot holds the expert chosen
    per_slot = torch.bincount(slots.flatten(), minlength=8).tolist()
    assert [per_slot[s] for s in (0, 4, 5)] == [20, 20, 20]  # expert 0: 60 rows, 3 copies
    assert [per_slot[s] for s in (1, 6)] == [15, 15]
    assert torch.equal(LayerPlacement.of(range(4), 4).dispatch(ids), ids)  # trivial: as is
    # expert 0 only on even tokens: numbering by token index would send it all to one copy
    twice = LayerPlacement.of([0, 1, 2, 3, 0, 1, 2, 3], num_experts=4)
    alternating = twice.dispatch(torch.tensor([[0, 1], [2, 3]] * 10))
    assert torch.bincount(alternating.flatten(), minlength=8).tolist() == [5] * 8


def test_init_expert_location_reads_maps_and_dumps(tmp_path: Path) -> None:
    counts = torch.tensor([[[0] * 8, [9, 1, 1, 1, 9, 1, 1, 1]]])  # [passes, layers, experts]
    dump = tmp_path / "dump.pt"
    torch.save({"rank": 0, "logical_count": counts}, dump)
    placed = load_expert_location(str(dump), 2, 8, 10, 2)
    assert placed == ExpertLocation.by_eplb(counts, 10, 2)
    given = {"physical_to_logical_map": placed.as_tensor().tolist()}
    assert load_expert_location(json.dumps(given), 2, 8, 10, 2) == placed
    (tmp_path / "map.json").write_text(json.dumps(given))
    assert load_expert_location(str(tmp_path / "map.json"), 2, 8, 10, 2) == placed
    assert load_expert_location("trivial", 2, 8, 10, 2).physical_to_logical[1][8:] == (0, 1)


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ('{"physical_to_logical_map": [[0, 1, 2, 3]]}', "physical_to_logical_map: expected"),
        ('{"physical_to_logical_map": [[0, 1, 2, 2, 0, 1]]}', "layer 0: experts [3]"),
        ('{"physical_to_logical_map": [[0, 1, 2, 9, 0, 1]]}', "in [0, 4)"),
        ('{"logical_count": [[1, 2]]}', "logical_count: expected"),
        ('{"other": 1}', "physical_to_logical_map or logical_count"),
        ("/no/such/file.json", "cannot read"),
    ],
)
def test_init_expert_location_refuses_what_does_not_fit(spec: str, message: str) -> None:
    with pytest.raises(ValueError, match="init_expert_location") as err:
        load_expert_location(spec, 1, 4, 6, 2)
    assert message in str(err.value)


def test_the_recorders_window_is_the_sum_of_its_kept_passes() -> None:
    """/metrics reads the window on every scrape: it is kept as passes come and, past the
    ring's size, go; it must equal the sum the dump stacks."""
    from radixserve.engine.layers.expert_distribution import ExpertDistributionRecorder

    recorder = ExpertDistributionRecorder(num_layers=2, num_experts=4, buffer_size=3)
    recorder.start()
    gen = torch.Generator().manual_seed(0)
    for n in range(5):  # two more than the ring holds
        ids = torch.randint(0, 4, (n + 2, 2), generator=gen)
        recorder.on_select(1, ids)
        recorder.end_pass()
        kept, window = recorder.window()
        assert kept == min(n + 1, 3)
    _, physical = recorder.dump()
    assert physical.shape[0] == 3 and torch.equal(window, physical.sum(0))
    assert recorder.window()[0] == 0 and not recorder.window()[1].any()  # a dump resets
