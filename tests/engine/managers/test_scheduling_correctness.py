"""Greedy outputs do not depend on how requests are scheduled or cached (SmolLM2).

Every configuration below runs the overlapped event loop and is compared with the plain
loop, so the matrix also shows that overlap changes no output.

32 concurrent prompts in 4 groups sharing long prefixes, run under every combination of
radix cache, chunked prefill, mixed chunks, policy and page size, must give the outputs of
the plainest configuration; a tiny KV pool must force retractions without changing them.
"""

from __future__ import annotations

import itertools
from typing import Any

import pytest

GROUPS = 4
PER_GROUP = 8
NEW_TOKENS = 6
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}


def make_prompts(tokenizer: Any) -> list[list[int]]:
    topics = ["the ocean", "mountain climbing", "medieval castles", "quantum computers"]
    out = []
    for g, topic in enumerate(topics[:GROUPS]):
        system = (f"You are an expert on {topic}. " * 8).strip()
        prefix = tokenizer.encode(system)
        for i in range(PER_GROUP):
            out.append(prefix + tokenizer.encode(f" Question {g}.{i}: tell me fact number {i}."))
    return out


@pytest.fixture(scope="module")
def prompts(smollm_engine: Any) -> list[list[int]]:
    return make_prompts(smollm_engine.tokenizer)


@pytest.fixture(scope="module")
def reference(smollm_engine: Any, prompts: list[list[int]]) -> list[list[int]]:
    # The plainest configuration: no cache sharing, no chunking, no overlap.
    plain = smollm_engine.with_args(
        disable_radix_cache=True, disable_overlap_schedule=True, max_total_tokens=16384
    )
    return [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=GREEDY)]


MATRIX = list(
    itertools.product(
        [False, True],  # disable_radix_cache
        [None, 64],  # chunked_prefill_size
        [False, True],  # enable_mixed_chunk
        ["fcfs", "lpm", "dfs-weight"],
        [1, 16],  # page_size
    )
)


def _id(case: tuple[Any, ...]) -> str:
    no_radix, chunk, mixed, policy, page = case
    cache = "noradix" if no_radix else "radix"
    mode = "mixed" if mixed else "plain"
    return f"{cache}-chunk{chunk}-{mode}-{policy}-p{page}"


@pytest.mark.parametrize("case", MATRIX, ids=[_id(c) for c in MATRIX])
def test_outputs_identical_across_configurations(
    smollm_engine: Any, prompts: list[list[int]], reference: list[list[int]], case: tuple
) -> None:
    no_radix, chunk, mixed, policy, page = case
    engine = smollm_engine.with_args(
        disable_radix_cache=no_radix,
        chunked_prefill_size=chunk,
        enable_mixed_chunk=mixed,
        schedule_policy=policy,
        page_size=page,
        max_total_tokens=6144,
    )
    try:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == reference
        engine.scheduler.check_memory_invariant()
    finally:
        engine.shutdown()


@pytest.mark.parametrize("page_size", [1, 16])
def test_small_pool_forces_retractions_without_changing_outputs(
    smollm_engine: Any, prompts: list[list[int]], page_size: int
) -> None:
    params = {**GREEDY, "max_new_tokens": 24}
    plain = smollm_engine.with_args(disable_radix_cache=True, max_total_tokens=16384)
    expected = [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    tight = smollm_engine.with_args(
        max_total_tokens=1024, page_size=page_size, chunked_prefill_size=64
    )
    outs = tight.generate(input_ids=prompts, sampling_params=params)
    assert sum(o["meta_info"]["total_retractions"] for o in outs) > 0
    assert [o["output_ids"] for o in outs] == expected
    tight.scheduler.check_memory_invariant()
