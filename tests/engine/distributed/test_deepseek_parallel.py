"""DeepSeek-V3 (MLA with q_lora_rank, YaRN, sigmoid grouped top-k with a correction bias, a
shared expert and a dense first layer: tests/engine/models/tiny.py) under the parallel
layouts DP attention and EP exist for. Each layout is the multi-process `Engine` (one scheduler
process per rank, gloo) on the 16-prompt chunked, cache-hitting, retracting batch of
test_tp_generate; its greedy outputs equal the in-process single-rank run:

- tp2: the heads split over the ranks, the latent cache whole on both;
- tp2/ep2 with the all-to-all dispatch (the all-reduce of the ranks' shares at tp2/ep2:
  test_eplb_generate.py, whose trivial placement is this layout);
- tp2/dp2 with DP attention: a latent cache per DP rank, the MoE over both ranks;
- tp2/dp2/ep2 with DP attention, then a batch pinned to DP rank 1 while rank 0 joins every
  forward with IDLE batches."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.distributed.test_dp_attention_generate import check_both_ranks_then_one
from tests.engine.distributed.test_tp_generate import ARGS, PARAMS, prompts

KIND = "deepseek_v3"
LAYOUTS = [  # tp, dp, ep, moe_a2a_backend, enable_dp_attention
    (2, 1, 1, "none", False),
    (2, 1, 2, "all_to_all", False),
    (2, 2, 1, "none", True),
    (2, 2, 2, "none", True),
]


def _ids(outs: Any) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize(
    ("tp", "dp", "ep", "backend", "dp_attention"),
    LAYOUTS,
    ids=[f"tp{t}-dp{d}-ep{e}-{b}{'-dpattn' if a else ''}" for t, d, e, b, a in LAYOUTS],
)
def test_deepseek_greedy_equals_single_process(  # noqa: PLR0913 - one argument per axis
    greedy_reference: Any, tp: int, dp: int, ep: int, backend: str, dp_attention: bool
) -> None:
    from radixserve.engine import Engine

    folder, want = greedy_reference(KIND, 5)
    layout = {"tp_size": tp, "dp_size": dp, "ep_size": ep, "moe_a2a_backend": backend}
    with Engine(
        model_path=str(folder), enable_dp_attention=dp_attention, **layout, **ARGS
    ) as engine:
        got = engine.generate(input_ids=prompts(), sampling_params=PARAMS)
        assert _ids(got) == want
        assert sum(o["meta_info"]["cached_tokens"] for o in got) > 0  # the radix cache was hit
        if dp > 1:
            check_both_ranks_then_one(engine, want)
