"""`--dp-size 2` without DP attention: two independent scheduling groups behind the data-parallel
controller, in the multi-process `Engine`. The 16-prompt chunked, cache-hitting batch gives the
single-process run's greedy outputs (each rank is a whole model); round-robin puts requests on
both ranks (each rank's own radix cache holds tokens afterwards); `data_parallel_rank` pins
requests to one rank, whose cache then serves their follow-ups while the other rank stays idle
and empty; an out-of-range rank is refused naming the field."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.distributed.test_tp_generate import ARGS, PARAMS, prompts

FLOAT32 = ARGS  # float32 and the chunk size explicit: CPU defaults differ (bf16, 1024)


def _ids(outs: Any) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


@pytest.fixture(scope="module")
def folder(greedy_reference: Any) -> Path:
    return greedy_reference("llama", 3)[0]


@pytest.fixture(scope="module")
def engine(folder: Path) -> Iterator[Any]:
    from radixserve.engine import Engine

    with Engine(model_path=str(folder), dp_size=2, **FLOAT32) as eng:
        yield eng


def test_dp2_greedy_equals_single_process(greedy_reference: Any, engine: Any) -> None:
    _, want = greedy_reference("llama", 3)
    assert engine.flush_cache()
    got = engine.generate(input_ids=prompts(), sampling_params=PARAMS)
    assert _ids(got) == want
    assert all(n > 0 for n in engine.cached_tokens_per_rank())  # round-robin used both ranks
    assert [load["dp_rank"] for load in engine.get_load()] == [0, 1]
    info = engine.get_server_info()
    assert (info["dp_size"], [r["dp_rank"] for r in info["dp_ranks"]]) == (2, [0, 1])


def test_pinned_requests_stay_on_their_rank(engine: Any) -> None:
    assert engine.flush_cache()
    batch = prompts()[:4]  # one family: a shared 40-token prefix
    first = engine.generate(input_ids=batch[:1], sampling_params=PARAMS, data_parallel_rank=1)
    assert first[0]["meta_info"]["cached_tokens"] == 0
    assert engine.cached_tokens_per_rank()[0] == 0  # rank 0 idle, its cache empty
    rest = engine.generate(input_ids=batch[1:], sampling_params=PARAMS, data_parallel_rank=1)
    assert all(o["meta_info"]["cached_tokens"] >= 40 for o in rest)  # rank 1's cache hit
    cached = engine.cached_tokens_per_rank()
    assert cached[0] == 0 and cached[1] > 0


def test_out_of_range_rank_is_refused(engine: Any) -> None:
    with pytest.raises(ValueError, match=r"^data_parallel_rank: must be an integer in \[0, 2\)"):
        engine.generate(input_ids=[5, 6, 7], sampling_params=PARAMS, data_parallel_rank=2)
