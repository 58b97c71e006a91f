"""EPLB on a skewed workload (issue 30): a random-weight DeepSeek-V3-shaped MoE (16 routed experts
in 4 groups, top-4 of the best 2 groups, sigmoid scores with a correction bias, a dense first
layer; tiny widths) served at tp4/ep4 by the multi-process Engine (gloo), float32. The prompts
repeat a few tokens, so the router favours a few experts.

Runs, each a fresh engine on the same prompts:
1. trivial placement (expert e in slot e) with the recorder: its dump;
2. placed by EPLB from that dump (`--init-expert-location`), no redundant experts;
3. the same with 4 redundant experts;
4. trivial start with `--enable-eplb` rebalancing every 16 forward passes while the requests
   arrive one after another.
For each: max/mean EP-rank load per MoE layer (summed from the slots the tokens were dispatched
to), whether the greedy outputs equal run 1's, failed requests; for 4, the rebalances and the
longest pause a move added to a step, beside the mean time per output token.

    .venv/bin/python scripts/bench_eplb.py        (an idle machine; ~2 minutes)
"""

from __future__ import annotations

import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from radixserve.engine import Engine  # noqa: E402
from radixserve.engine.layers.eplb_algorithm import balancedness, rank_loads  # noqa: E402
from radixserve.engine.layers.expert_location import ExpertLocation  # noqa: E402
from tests.engine.models.tiny import save_tiny  # noqa: E402

EP = 4
LAYOUT = {"tp_size": EP, "ep_size": EP, "dtype": "float32"}
PARAMS = {"temperature": 0, "max_new_tokens": 32, "ignore_eos": True}
MODEL = {"n_routed_experts": 16, "num_experts_per_tok": 4, "num_hidden_layers": 4}


def prompts() -> list[list[int]]:
    hot = [17, 123, 45, 201]
    return [[hot[(i + j * (i % 3 + 1)) % 4] for j in range(48 + 8 * i)] for i in range(16)]


def per_layer(dump: dict[str, Any]) -> list[float]:
    slots = torch.tensor(dump["physical_count"]).sum(0)
    return [round(balancedness(rank_loads(row, EP)), 3) for row in slots.tolist() if any(row)]


def recorded(folder: Path, **flags: Any) -> tuple[list[list[int]], dict[str, Any]]:
    with Engine(model_path=str(folder), expert_distribution_recorder_mode="stat", **LAYOUT,
                **flags) as engine:  # fmt: skip
        engine.expert_distribution("start")
        outs = engine.generate(input_ids=prompts(), sampling_params=PARAMS)
        return [o["output_ids"] for o in outs], engine.expert_distribution("dump")


def streamed(folder: Path) -> tuple[list[list[int] | None], dict[str, Any], float]:
    flags = {"enable_eplb": True, "eplb_rebalance_num_iterations": 16}
    with Engine(model_path=str(folder), **LAYOUT, **flags) as engine:

        def one(i: int) -> tuple[list[int] | None, float]:
            time.sleep(0.5 * i)
            start = time.perf_counter()
            try:
                out = engine.generate(input_ids=prompts()[i], sampling_params=PARAMS)
            except Exception:  # noqa: BLE001 - counted as a failed request
                return None, 0.0
            return out["output_ids"], (time.perf_counter() - start) / PARAMS["max_new_tokens"]

        with ThreadPoolExecutor(16) as pool:
            results = list(pool.map(one, range(16)))
        (load,) = engine.get_load()
    tpot = sum(t for _, t in results) / len(results)
    return [ids for ids, _ in results], load["experts"], tpot


def main() -> None:
    cpu = next(line for line in Path("/proc/cpuinfo").read_text().splitlines()
               if line.startswith("model name")).split(":")[1].strip()  # fmt: skip
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "deepseek-v3-16e"
        save_tiny("deepseek_v3", folder, seed=0, **MODEL)
        want, trivial = recorded(folder)
        dump = Path(tmp) / "dump.pt"
        torch.save({"logical_count": torch.tensor(trivial["logical_count"])}, dump)
        rows = [("trivial placement", trivial, want)]
        for redundant in (0, 4):
            got, placed = recorded(folder, init_expert_location=str(dump),
                                   ep_num_redundant_experts=redundant)  # fmt: skip
            rows.append((f"EPLB, {redundant} redundant", placed, got))
        online, experts, tpot = streamed(folder)
    print(f"CPU: {cpu}; tp{EP}/ep{EP}, 16 experts top-4, {len(prompts())} skewed prompts")
    print("| placement | max/mean EP-rank load per MoE layer | mean | EPLB's estimate | "
          "outputs = trivial's |")  # fmt: skip
    print("|---|---|---|---|---|")
    counts = torch.tensor(trivial["logical_count"]).sum(0)
    for name, record, got in rows:
        layers = per_layer(record)
        placed = ExpertLocation(tuple(map(tuple, record["physical_to_logical_map"])), 16)
        estimate = placed.estimated_balancedness(counts, EP)
        print(f"| {name} | {layers} | {sum(layers) / len(layers):.3f} | {estimate:.3f} | "
              f"{got == want} |")  # fmt: skip
    failed = sum(ids is None for ids in online)
    print(
        f"online --enable-eplb (every 16 passes, requests streaming): {failed} failed, "
        f"outputs = trivial's: {online == want}, {experts['rebalances']} rebalances, "
        f"{experts['moved_layers']} layer moves, longest pause "
        f"{1000 * experts['max_move_seconds']:.1f} ms vs a mean {1000 * tpot:.0f} ms per "
        f"output token, max/mean load over the last window {experts['balancedness']:.3f}"
    )


if __name__ == "__main__":
    main()
