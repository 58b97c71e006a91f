"""Greedy outputs under tensor parallelism equal the single-process run: tiny random-weight
Llama at tp=2 and tp=4 (4 heads, 2 KV heads: split, then replicated), Qwen2 (q/k/v biases) and
Qwen3 (q/k norm) at tp=2. Each layout is the multi-process `Engine` (one scheduler process per
rank, gloo); the batch is 16+ prompts with shared prefixes, chunked (32-token chunks) and
hitting the radix cache, with a KV pool small enough to force retractions (see POOL), sent in one
call; the reference is the in-process `EngineCore` (conftest.greedy_reference: once per model)."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from tests.engine.models.tiny import VOCAB

# A 256-token pool for 16 prompts of 45-100 tokens decoding 40 each: running requests outgrow
# it, so the scheduler retracts (and re-prefills) some. The in-process reference receives the
# whole batch at once and always retracts; a multi-process run receives the requests over a few
# scheduling rounds, so how often it retracts depends on their arrival, and only its outputs are
# compared (ranks retract in lock-step: they run the same schedule).
POOL = 256
ARGS = {  # float32 and the chunk size explicit: CPU defaults differ (bf16, 1024-token chunks)
    "dtype": "float32",
    "max_total_tokens": POOL,
    "chunked_prefill_size": 32,
    "max_prefill_tokens": 96,
}
PARAMS = {"temperature": 0, "max_new_tokens": 40, "ignore_eos": True}


def prompts() -> list[list[int]]:
    """4 families × 4 prompts: a shared 40-token prefix, then suffixes of 5-60 tokens."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for _family in range(4):
        prefix = torch.randint(2, VOCAB, (40,), generator=gen).tolist()
        for n in (5, 20, 35, 60):
            out.append(prefix + torch.randint(2, VOCAB, (n,), generator=gen).tolist())
    return out


def _ids(outs: Any) -> list[list[int]]:
    return [o["output_ids"] for o in outs]


def retractions(outs: Any) -> int:
    return sum(o["meta_info"]["total_retractions"] for o in outs)


@pytest.mark.parametrize(("kind", "tp"), [("llama", 2), ("llama", 4), ("qwen2", 2), ("qwen3", 2)])
def test_tp_greedy_equals_single_process(greedy_reference: Any, kind: str, tp: int) -> None:
    from radixserve.engine import Engine

    batch = prompts()
    folder, want = greedy_reference(kind, 3)
    with Engine(model_path=str(folder), tp_size=tp, **ARGS) as engine:
        got = engine.generate(input_ids=batch, sampling_params=PARAMS)
        info = engine.get_server_info()
        procs = list(engine.children.procs)
    assert len(procs) == tp + 1  # one scheduler per rank + the detokenizer
    assert not [p.name for p in procs if p.is_alive()]  # shutdown stopped every rank
    assert _ids(got) == want
    assert sum(o["meta_info"]["cached_tokens"] for o in got) > 0  # the radix cache was hit
    assert info["max_total_num_tokens"] == POOL
