"""HiCache under tensor parallelism: each rank keeps its own heads in its own host tier and
storage files, the ranks agree on every storage hit, and the greedy outputs equal the
single-process run without tiers (tiny random-weight Llama, tp=2, the batch and pool of
test_tp_generate.py: retractions, chunks, prefix hits). A second tp=2 engine over the first
one's storage folder answers the same, reading what the first one wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.engine.distributed.test_tp_generate import ARGS, PARAMS, _ids, prompts


def _hicache(tmp: Path) -> dict[str, Any]:
    extra = json.dumps({"file_storage_path": str(tmp), "prefetch_threshold": 0})
    return {
        **ARGS, "tp_size": 2, "enable_hierarchical_cache": True, "hicache_ratio": 4.0,
        "hicache_storage_backend": "file", "hicache_storage_backend_extra_config": extra,
    }  # fmt: skip


def test_tp_hicache_from_host_and_storage_equals_single_process(
    greedy_reference: Any, tmp_path: Path
) -> None:
    from radixserve.engine import Engine

    batch = prompts()
    folder, want = greedy_reference("llama", 3)
    with Engine(model_path=str(folder), **_hicache(tmp_path)) as engine:
        assert _ids(engine.generate(input_ids=batch, sampling_params=PARAMS)) == want
        (load,) = engine.get_load()
        # the pool of 256 holds 2.5 of the 4 families: their prefixes come back from host
        assert load["hicache"]["host_hit_tokens"] > 0
    for rank in (0, 1):  # each rank stored its own heads under its own names
        assert list(tmp_path.glob(f"*_{rank}_2.bin"))
    with Engine(model_path=str(folder), **_hicache(tmp_path)) as second:
        assert _ids(second.generate(input_ids=batch, sampling_params=PARAMS)) == want
        (load,) = second.get_load()
        assert load["hicache"]["storage_hit_tokens"] > 0


def test_dp_attention_hicache_equals_single_process(greedy_reference: Any, tmp_path: Path) -> None:
    """DP attention (tp=2, dp=2: a tree, a host tier and storage per DP rank; both DP ranks hold
    the same heads, so they share their storage files): the single-process answers, host hits
    on the ranks, and each DP rank's `/server_info` storage id is the same."""
    from radixserve.engine import Engine

    folder, want = greedy_reference("llama", 5)
    args = {**_hicache(tmp_path), "dp_size": 2, "enable_dp_attention": True}
    with Engine(model_path=str(folder), **args) as engine:
        assert _ids(engine.generate(input_ids=prompts(), sampling_params=PARAMS)) == want
        loads = engine.get_load()
        assert [load["dp_rank"] for load in loads] == [0, 1]
        assert sum(load["hicache"]["host_hit_tokens"] for load in loads) > 0
        ids = {r["hicache_storage_id"] for r in engine.get_server_info()["dp_ranks"]}
        assert len(ids) == 1 and None not in ids
