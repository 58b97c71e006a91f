"""Greedy outputs under DP attention equal the single-process run. Each layout is the
multi-process `Engine` with `enable_dp_attention` (one world of tp_size ranks; attention, KV
cache, radix tree and scheduler per DP rank; MLP / MoE over the whole world between a gather
and a scatter), on the 16-prompt chunked, cache-hitting, retracting batch of test_tp_generate:

- dense Llama at tp=2, dp=2 (attention-TP 1) and tp=4, dp=2 (attention-TP 2: heads split
  inside each DP rank);
- Qwen2-MoE (shared expert) at tp=2, dp=2 with ep=2 and all_to_all dispatch (the `none`
  dispatch at that layout runs on DeepSeek-V3, test_deepseek_parallel.py).

The batch is spread over both DP ranks (each one's own cache holds tokens afterwards). Then a
batch pinned to DP rank 1 (`data_parallel_rank`) runs while rank 0 has nothing: rank 0 joins
every forward with IDLE batches, and its cache stays empty. The reference is the in-process
`EngineCore`, computed once per model for the session (conftest.greedy_reference)."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.distributed.test_tp_generate import ARGS, PARAMS, prompts

LAYOUTS = [  # kind, tp, dp, ep, moe_a2a_backend
    ("llama", 2, 2, 1, "none"),
    ("llama", 4, 2, 1, "none"),
    ("qwen2_moe", 2, 2, 2, "all_to_all"),
    # tp=2/dp=2/ep=2 with the `none` dispatch: DeepSeek-V3's, in test_deepseek_parallel.py
]
FLOAT32 = ARGS  # float32 and the chunk size explicit: CPU defaults differ (bf16, 1024)


def _ids(outs: Any) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


def check_both_ranks_then_one(engine: Any, want: list[list[int]]) -> None:
    """Both DP ranks served the batch; then 8 prompts pinned to DP rank 1 give the same
    outputs while rank 0 steps IDLE beside every forward (its cache stays empty)."""
    assert all(n > 0 for n in engine.cached_tokens_per_rank())
    assert engine.flush_cache()
    pinned = engine.generate(input_ids=prompts()[:8], sampling_params=PARAMS, data_parallel_rank=1)
    assert _ids(pinned) == want[:8]
    cached = engine.cached_tokens_per_rank()
    assert cached[0] == 0 and cached[1] > 0


@pytest.mark.parametrize(("kind", "tp", "dp", "ep", "backend"), LAYOUTS)
def test_dp_attention_greedy_equals_single_process(
    greedy_reference: Any, kind: str, tp: int, dp: int, ep: int, backend: str
) -> None:
    from radixserve.engine import Engine

    folder, want = greedy_reference(kind, 5)
    layout = {"tp_size": tp, "dp_size": dp, "ep_size": ep, "moe_a2a_backend": backend}
    with Engine(model_path=str(folder), enable_dp_attention=True, **layout, **FLOAT32) as engine:
        procs = list(engine.children.procs)
        got = engine.generate(input_ids=prompts(), sampling_params=PARAMS)
        assert _ids(got) == want
        assert sum(o["meta_info"]["cached_tokens"] for o in got) > 0  # the radix cache was hit
        check_both_ranks_then_one(engine, want)
        info = engine.get_server_info()
    assert len(procs) == tp + 1  # one scheduler per rank of the one world + the detokenizer
    assert not [p.name for p in procs if p.is_alive()]  # shutdown stopped every rank
    assert (info["enable_dp_attention"], [r["dp_rank"] for r in info["dp_ranks"]]) == (True, [0, 1])
