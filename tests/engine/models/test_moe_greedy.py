"""Greedy generation on the tiny MoE checkpoints: `EngineCore.generate` (a batch, continuous
batching, prefill then decode through the scheduler) gives transformers' `generate` tokens,
token for token, for each prompt; also with chunked prefill and a shared prefix in the cache."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from tests.engine.models.tiny import MOE_KINDS, random_prompts, save_tiny

NEW_TOKENS = 12
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def hf_greedy(model: Any, ids: list[int]) -> list[int]:
    """transformers' greedy `generate` on one unpadded prompt, EOS never stopping it. The mask
    is explicit: without it `generate` would mask every prompt token equal to pad_token_id."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            do_sample=False,
            max_new_tokens=NEW_TOKENS,
            min_new_tokens=NEW_TOKENS,
            eos_token_id=None,
            pad_token_id=0,
        )
    return [int(t) for t in out[0, len(ids) :]]


def prompts() -> list[list[int]]:
    """Four prompts of mixed lengths; the last two share a 24-token prefix."""
    a, b, prefix = random_prompts((5, 33, 24), seed=7)
    tail1, tail2 = random_prompts((6, 11), seed=8)
    return [a, b, prefix + tail1, prefix + tail2]


@pytest.fixture(scope="module", params=list(MOE_KINDS))
def tiny(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any]]:
    from radixserve.engine import EngineCore

    kind: str = request.param
    folder: Path = tmp_path_factory.mktemp(f"greedy-{kind}")
    hf = save_tiny(kind, folder, seed=20 + list(MOE_KINDS).index(kind))
    engine = EngineCore(model_path=str(folder), max_total_tokens=2048, dtype="float32")
    yield hf, engine
    engine.shutdown()


def test_batch_greedy_matches_transformers_generate(tiny: tuple[Any, Any]) -> None:
    hf, engine = tiny
    batch = prompts()
    outs = engine.generate(input_ids=batch, sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == [hf_greedy(hf, ids) for ids in batch]


def test_chunked_prefill_and_cache_hits_keep_the_greedy_tokens(tiny: tuple[Any, Any]) -> None:
    hf, engine = tiny
    chunked = engine.with_args(chunked_prefill_size=8, max_total_tokens=1024)
    batch = prompts()
    first = chunked.generate(input_ids=batch, sampling_params=GREEDY)
    again = chunked.generate(input_ids=batch[2:], sampling_params=GREEDY)
    assert all(o["meta_info"]["cached_tokens"] >= 24 for o in again)
    want = [hf_greedy(hf, ids) for ids in batch]
    assert [o["output_ids"] for o in first] == want
    assert [o["output_ids"] for o in again] == want[2:]
    chunked.scheduler.check_memory_invariant()
