"""Greedy generation on the tiny DeepSeek-V2 / V3 checkpoints: `EngineCore.generate` (a batch,
continuous batching, prefill then decode over the latent pool) gives transformers' `generate`
tokens, token for token, for each prompt: on both CPU backends, at page sizes 1 and 16, without
and with chunked prefill, and again when the prompts come back as radix-cache hits.

A random router can put two experts' scores within float32 rounding of each other (a gap of
2e-7 met at one seed): the absorbed and expanded attention then route that token differently
and the texts part ways, with neither wrong. The seeds here meet no such tie."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.engine.models.test_moe_greedy import GREEDY, hf_greedy, prompts
from tests.engine.models.tiny import DEEPSEEK_KINDS, save_tiny


@pytest.fixture(scope="module", params=list(DEEPSEEK_KINDS))
def tiny(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[Any, Any, list[list[int]]]]:
    from radixserve.engine import EngineCore

    kind: str = request.param
    folder: Path = tmp_path_factory.mktemp(f"greedy-{kind}")
    hf = save_tiny(kind, folder, seed=60 + list(DEEPSEEK_KINDS).index(kind))
    engine = EngineCore(model_path=str(folder), max_total_tokens=2048, dtype="float32")
    want = [hf_greedy(hf, ids) for ids in prompts()]
    yield hf, engine, want
    engine.shutdown()


@pytest.mark.parametrize("backend", ["torch", "grouped"])
@pytest.mark.parametrize("page", [1, 16])
def test_greedy_matches_transformers_generate(
    tiny: tuple[Any, Any, list[list[int]]], backend: str, page: int
) -> None:
    _hf, engine, want = tiny
    core = engine.with_args(attention_backend=backend, page_size=page, max_total_tokens=1024)
    outs = core.generate(input_ids=prompts(), sampling_params=GREEDY)
    assert [o["output_ids"] for o in outs] == want
    core.scheduler.check_memory_invariant()


@pytest.mark.parametrize("backend", ["torch", "grouped"])
@pytest.mark.parametrize("page", [1, 16])
def test_chunked_prefill_and_cache_hits_keep_the_greedy_tokens(
    tiny: tuple[Any, Any, list[list[int]]], backend: str, page: int
) -> None:
    _hf, engine, want = tiny
    chunked = engine.with_args(
        attention_backend=backend,
        page_size=page,
        chunked_prefill_size=max(8, page),  # a chunk holds whole pages
        max_total_tokens=1024,
    )
    batch = prompts()
    first = chunked.generate(input_ids=batch, sampling_params=GREEDY)
    again = chunked.generate(input_ids=batch[2:], sampling_params=GREEDY)
    assert all(o["meta_info"]["cached_tokens"] >= 16 for o in again)
    assert [o["output_ids"] for o in first] == want
    assert [o["output_ids"] for o in again] == want[2:]
    chunked.scheduler.check_memory_invariant()
