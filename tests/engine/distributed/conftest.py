"""One single-process reference per tiny model for the whole session: every parallel layout of
test_tp_generate, test_dp_generate, test_ep_generate and test_dp_attention_generate compares its
greedy outputs on the same 16-prompt batch with the in-process `EngineCore`'s, so each
(model kind, seed) is saved and run once."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from tests.engine.distributed.test_tp_generate import ARGS, PARAMS, prompts, retractions
from tests.engine.models.tiny import save_tiny

Reference = Callable[[str, int], tuple[Path, list[list[int]]]]


@pytest.fixture(scope="session")
def greedy_reference(tmp_path_factory: pytest.TempPathFactory) -> Reference:
    """(kind, seed) → (checkpoint folder, the single-process greedy output ids)."""
    cache: dict[tuple[str, int], tuple[Path, list[list[int]]]] = {}

    def get(kind: str, seed: int) -> tuple[Path, list[list[int]]]:
        if (kind, seed) not in cache:
            from radixserve.engine import EngineCore

            folder = tmp_path_factory.mktemp(f"{kind}-{seed}")
            save_tiny(kind, folder, seed=seed)
            core = EngineCore(model_path=str(folder), **ARGS)
            want = core.generate(input_ids=prompts(), sampling_params=PARAMS)
            core.shutdown()
            assert retractions(want) > 0  # the batch outgrows the pool
            cache[kind, seed] = folder, [o["output_ids"] for o in want]
        return cache[kind, seed]

    return get
