"""Greedy outputs of a tiny random-weight MoE model under tensor and expert parallelism equal
the single-process run: Qwen2-MoE (8 experts, top-2, a shared expert; both layers sparse) at
tp=2 with experts replicated, and at tp=2/ep=2 (4 experts per rank) with each dispatch mode
(none: all-reduce of the ranks' shares; all_to_all: tokens sent to their experts' owners).
Each layout is the multi-process `Engine` (one scheduler process per rank, gloo) on the
16-prompt chunked, cache-hitting, retracting batch of test_tp_generate (see its POOL); the
reference is the in-process `EngineCore`, computed once."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.distributed.test_tp_generate import ARGS, PARAMS, prompts

LAYOUTS = [
    ("qwen2_moe", 2, 1, "none"),
    ("qwen2_moe", 2, 2, "none"),
    ("qwen2_moe", 2, 2, "all_to_all"),
]
FLOAT32 = ARGS  # float32 and the chunk size explicit: CPU defaults differ (bf16, 1024)


def _ids(outs: Any) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


@pytest.mark.parametrize(("kind", "tp", "ep", "backend"), LAYOUTS)
def test_moe_greedy_equals_single_process(
    greedy_reference: Any, kind: str, tp: int, ep: int, backend: str
) -> None:
    from radixserve.engine import Engine

    folder, want = greedy_reference(kind, 5)
    with Engine(
        model_path=str(folder), tp_size=tp, ep_size=ep, moe_a2a_backend=backend, **FLOAT32
    ) as engine:
        got = engine.generate(input_ids=prompts(), sampling_params=PARAMS)
    assert _ids(got) == want
    assert sum(o["meta_info"]["cached_tokens"] for o in got) > 0  # the radix cache was hit
