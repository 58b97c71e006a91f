"""EPLB on a tiny DeepSeek-V3 (8 routed experts, top-2 of 2 of 4 groups, a dense first layer)
under tp2/ep2: the multi-process `Engine`, one scheduler process per rank, gloo. The workload is
skewed: prompts of three repeated tokens, whose tokens the router sends to a few experts.

1. Trivial placement (expert e in slot e): the recorder's distribution, and each EP rank's
   load, summed from the slots the tokens were dispatched to; the greedy outputs equal the
   single-process run's.
2. Started from that dump (`--init-expert-location`) with 2 redundant experts: the hot experts
   are copied, the busiest rank's share falls, and the outputs are the same.
3. `--enable-eplb` rebalancing every 4 forward passes, one layer per pass, while requests arrive
   one after another, under DP attention (tp2/dp2/ep2, so a DP rank with no request joins each
   forward with an IDLE batch) and the all-to-all dispatch: none fails, every output is the
   same, and the placement moved.

Every figure is in the test's output (`-s`); docs/benchmarks.md has the bench's numbers."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import msgspec
import pytest
import torch

from radixserve.engine.layers.eplb_algorithm import mean_balancedness
from tests.engine.models.tiny import save_tiny

EP = {"tp_size": 2, "ep_size": 2, "dtype": "float32", "chunked_prefill_size": 32}
PARAMS = {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True}


def skewed_prompts() -> list[list[int]]:
    hot = [17, 123, 45]
    return [[hot[(3 * i + j) % 3] for j in range(20 + 6 * i)] for i in range(8)]


def rank_balancedness(dump: dict[str, Any]) -> float:
    """Mean over MoE layers of max/mean EP-rank load, from the dispatched slots' counts."""
    slots = torch.tensor(dump["physical_count"]).sum(0)  # [layers, slots]
    return mean_balancedness(slots.tolist(), 2)


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[list[int]]]:
    from radixserve.engine import EngineCore

    folder = tmp_path_factory.mktemp("deepseek-v3-eplb")
    save_tiny("deepseek_v3", folder, seed=0)
    core = EngineCore(model_path=str(folder), dtype="float32", chunked_prefill_size=32)
    want = [
        o["output_ids"] for o in core.generate(input_ids=skewed_prompts(), sampling_params=PARAMS)
    ]
    core.shutdown()
    return folder, want


def scraped(engine: Any) -> dict[str, float]:
    """DP rank 0's expert series on /metrics, as the tokenizer manager renders them."""
    from prometheus_client.parser import text_string_to_metric_families

    from radixserve.engine.ipc.messages import LoadOutput
    from radixserve.engine.tokenizer.metrics import EngineMetrics

    loads = [msgspec.convert(load, LoadOutput) for load in engine.get_load()]
    text = EngineMetrics("m").render(loads).decode()
    samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    return {s.name: s.value for s in samples if s.labels.get("dp_rank") == "0"}


def _recorded(engine: Any) -> tuple[list[list[int]], dict[str, Any]]:
    engine.expert_distribution("start")
    outs = engine.generate(input_ids=skewed_prompts(), sampling_params=PARAMS)
    gauge = scraped(engine)["radixserve:expert_balancedness"]
    dump = engine.expert_distribution("dump")
    assert gauge == pytest.approx(rank_balancedness(dump))  # the metric is the dump's figure
    return [o["output_ids"] for o in outs], dump


def test_placement_from_a_recorded_dump_balances_the_ranks_with_the_same_outputs(
    model: tuple[Path, list[list[int]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from radixserve.engine import Engine

    folder, want = model
    monkeypatch.setenv("SGLANG_EXPERT_DISTRIBUTION_RECORDER_DIR", str(tmp_path))
    stat = {"expert_distribution_recorder_mode": "stat"}
    with Engine(model_path=str(folder), **EP, **stat) as engine:
        trivial, before = _recorded(engine)
    assert trivial == want
    assert before["physical_to_logical_map"][1] == list(range(8))
    logical = torch.tensor(before["logical_count"]).sum(0)
    assert torch.equal(logical, torch.tensor(before["physical_count"]).sum(0))
    placed = {"init_expert_location": before["path"], "ep_num_redundant_experts": 2}
    with Engine(model_path=str(folder), **EP, **stat, **placed) as engine:
        got, after = _recorded(engine)
    assert got == want
    for layer in (1, 2):  # each MoE layer copies its hottest expert
        assert after["physical_to_logical_map"][layer].count(int(logical[layer].argmax())) > 1
    print(f"\nmax/mean EP-rank load: trivial {rank_balancedness(before):.3f}, "
          f"EPLB + 2 redundant {rank_balancedness(after):.3f}")  # fmt: skip
    assert rank_balancedness(before) > 1.25 > rank_balancedness(after)


def test_online_rebalance_while_requests_stream_fails_none(
    model: tuple[Path, list[list[int]]],
) -> None:
    from radixserve.engine import Engine

    folder, want = model
    online = {"enable_eplb": True, "eplb_rebalance_num_iterations": 4,
              "eplb_rebalance_layers_per_chunk": 1}  # fmt: skip
    layout = {"dp_size": 2, "enable_dp_attention": True, "moe_a2a_backend": "all_to_all"}
    prompts = skewed_prompts()
    with Engine(model_path=str(folder), **EP, **layout, **online) as engine:

        def one(i: int) -> list[int]:
            time.sleep(0.3 * i)  # arrivals spread over the run, as a stream
            return engine.generate(input_ids=prompts[i], sampling_params=PARAMS)["output_ids"]

        with ThreadPoolExecutor(len(prompts)) as pool:
            got = list(pool.map(one, range(len(prompts))))
        dump = engine.expert_distribution("dump")
        metrics = scraped(engine)
    assert got == want  # every request finished, each with the single process's output
    assert metrics["radixserve:eplb_rebalances_total"] >= 1
    assert metrics["radixserve:eplb_moved_layers_total"] >= 2
    moved = dump["physical_to_logical_map"][1:]
    assert moved != [list(range(8))] * 2, "no rebalance took place"
    print(f"\nonline EPLB: {metrics['radixserve:eplb_rebalances_total']:.0f} rebalances, "
          f"longest move {1000 * metrics['radixserve:eplb_max_move_seconds']:.1f} ms, "
          f"placement now {moved}")  # fmt: skip
