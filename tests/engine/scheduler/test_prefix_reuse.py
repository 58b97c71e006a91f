"""Prefix reuse is real: cached_tokens follows SGLang's meaning and outputs do not change."""

from __future__ import annotations

from typing import Any

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


@pytest.fixture()
def engine(smollm_engine: Any) -> Any:
    return smollm_engine.with_args(max_total_tokens=8192)


def cached(engine: Any, ids: list[int]) -> int:
    return engine.generate(input_ids=ids, sampling_params=GREEDY)["meta_info"]["cached_tokens"]


def test_cached_tokens_sequence(engine: Any) -> None:
    # SGLang's test_cache_tokens, scaled down: the len − 1 cap and finished-request insertion.
    base = list(range(1000, 1100))
    assert cached(engine, base) == 0
    assert cached(engine, list(range(1000, 1300))) == 100
    assert cached(engine, list(range(1000, 1300))) == 299
    assert cached(engine, list(range(1000, 1200))) == 199
    assert cached(engine, list(range(1000, 1400))) == 300


def test_generated_tokens_are_cached_at_finish(engine: Any) -> None:
    prompt = engine.tokenizer.encode("Count from one to ten: one, two,")
    first = engine.generate(input_ids=prompt, sampling_params=GREEDY)
    follow = prompt + first["output_ids"] + engine.tokenizer.encode(" and then")
    # All of prompt + outputs except the last sampled token have KV and are cached.
    shared = len(prompt) + len(first["output_ids"]) - 1
    assert cached(engine, follow) == shared


def test_outputs_equal_with_cache_disabled(engine: Any, smollm_engine: Any) -> None:
    prompt = engine.tokenizer.encode("The history of the printing press begins")
    params = {**GREEDY, "max_new_tokens": 12}
    first = engine.generate(input_ids=prompt, sampling_params=params)
    follow = prompt + first["output_ids"] + engine.tokenizer.encode(". Later,")
    warm = engine.generate(input_ids=follow, sampling_params=params)
    assert warm["meta_info"]["cached_tokens"] > len(prompt)
    cold = smollm_engine.with_args(disable_radix_cache=True, max_total_tokens=8192)
    ref = cold.generate(input_ids=follow, sampling_params=params)
    assert ref["meta_info"]["cached_tokens"] == 0
    assert warm["output_ids"] == ref["output_ids"]


def test_flush_cache_forgets_everything(engine: Any) -> None:
    ids = list(range(2000, 2064))
    cached(engine, ids)
    assert cached(engine, ids) == 63
    assert engine.scheduler.flush_cache()
    assert cached(engine, ids) == 0
    engine.scheduler.check_memory_invariant()
