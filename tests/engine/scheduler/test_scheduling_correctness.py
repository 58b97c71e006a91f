"""Greedy outputs do not depend on how requests are scheduled or cached.

Every configuration below runs the overlapped event loop and is compared with the plain
loop, so the matrix also shows that overlap changes no output.

32 concurrent prompts in 4 groups sharing long prefixes, run under every combination of
radix cache, chunked prefill, mixed chunks, policy and page size (48 cases), must give the
outputs of the plainest configuration; a tiny KV pool must force retractions without
changing them.

The full matrix runs on a tiny random-weight Llama written by transformers (2 layers,
hidden 64, float32): scheduling is what is under test, and the tiny model exercises every
scheduler, cache and pool path at a fraction of the cost. Prompts are longer than the
64-token chunk, so single requests really are split. A covering subset (every value of every
dimension at least once) and one retraction run repeat it on the real SmolLM2.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pytest

from tests.engine.models.tiny import random_prompts, save_tiny

GROUPS = 4
PER_GROUP = 8
NEW_TOKENS = 6
GREEDY = {"temperature": 0, "max_new_tokens": NEW_TOKENS, "ignore_eos": True}
RETRACT = {**GREEDY, "max_new_tokens": 24}


def smollm_prompts(tokenizer: Any) -> list[list[int]]:
    topics = ["the ocean", "mountain climbing", "medieval castles", "quantum computers"]
    out = []
    for g, topic in enumerate(topics[:GROUPS]):
        system = (f"You are an expert on {topic}. " * 8).strip()
        prefix = tokenizer.encode(system)
        for i in range(PER_GROUP):
            out.append(prefix + tokenizer.encode(f" Question {g}.{i}: tell me fact number {i}."))
    return out


def tiny_prompts() -> list[list[int]]:
    """4 groups of 8: prefixes of 72 and 40 tokens, each prompt its own 3-12 token tail, so
    half the prompts (76-84 tokens) are longer than a 64-token chunk."""
    prefixes = random_prompts((72, 40, 72, 40), seed=11)
    tails = random_prompts(tuple(3 + (i % 10) for i in range(GROUPS * PER_GROUP)), seed=12)
    return [prefixes[i // PER_GROUP] + tail for i, tail in enumerate(tails)]


def plain_outputs(engine: Any, prompts: list[list[int]], params: dict[str, Any]) -> list[Any]:
    """The plainest configuration: no cache sharing, no chunking, no overlap, and the
    reference attention backend (every other case runs the device default, on CPU the
    grouped backend, so the matrix also checks it against the reference token for token)."""
    plain = engine.with_args(
        disable_radix_cache=True,
        disable_overlap_schedule=True,
        chunked_prefill_size=-1,
        attention_backend="torch",
        max_total_tokens=16384,
    )
    try:
        return [o["output_ids"] for o in plain.generate(input_ids=prompts, sampling_params=params)]
    finally:
        plain.shutdown()


@pytest.fixture(scope="module")
def tiny_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    from radixserve.engine import EngineCore

    folder = tmp_path_factory.mktemp("sched-llama")
    save_tiny("llama", folder, seed=3)
    engine = EngineCore(model_path=str(folder), max_total_tokens=16384, dtype="float32")
    yield engine
    engine.shutdown()


@pytest.fixture(scope="module")
def tiny_reference(tiny_engine: Any) -> list[list[int]]:
    return plain_outputs(tiny_engine, tiny_prompts(), GREEDY)


@pytest.fixture(scope="module")
def prompts(smollm_engine: Any) -> list[list[int]]:
    return smollm_prompts(smollm_engine.tokenizer)


@pytest.fixture(scope="module")
def reference(smollm_engine: Any, prompts: list[list[int]]) -> list[list[int]]:
    return plain_outputs(smollm_engine, prompts, GREEDY)


MATRIX = list(
    itertools.product(
        [False, True],  # disable_radix_cache
        [None, 64],  # chunked_prefill_size
        [False, True],  # enable_mixed_chunk
        ["fcfs", "lpm", "dfs-weight"],
        [1, 16],  # page_size
    )
)

# Every value of every dimension at least once, the heaviest combinations first.
SMOLLM_SUBSET = [
    (False, 64, True, "lpm", 16),
    (True, 64, True, "dfs-weight", 1),
    (False, None, False, "fcfs", 1),
    (False, 64, False, "dfs-weight", 16),
]


def _id(case: tuple[Any, ...]) -> str:
    no_radix, chunk, mixed, policy, page = case
    cache = "noradix" if no_radix else "radix"
    mode = "mixed" if mixed else "plain"
    return f"{cache}-chunk{chunk}-{mode}-{policy}-p{page}"


def run_case(engine: Any, prompts: list[list[int]], case: tuple[Any, ...]) -> list[Any]:
    no_radix, chunk, mixed, policy, page = case
    configured = engine.with_args(
        disable_radix_cache=no_radix,
        chunked_prefill_size=chunk,
        enable_mixed_chunk=mixed,
        schedule_policy=policy,
        page_size=page,
        max_total_tokens=6144,
        disable_overlap_schedule=False,  # overlap is off by default on CPU; test it here
    )
    try:
        outs = configured.generate(input_ids=prompts, sampling_params=GREEDY)
        configured.scheduler.check_memory_invariant()
        return [o["output_ids"] for o in outs]
    finally:
        configured.shutdown()


@pytest.mark.parametrize("case", MATRIX, ids=[_id(c) for c in MATRIX])
def test_outputs_identical_across_configurations(
    tiny_engine: Any, tiny_reference: list[list[int]], case: tuple[Any, ...]
) -> None:
    assert run_case(tiny_engine, tiny_prompts(), case) == tiny_reference


@pytest.mark.parametrize("case", SMOLLM_SUBSET, ids=[_id(c) for c in SMOLLM_SUBSET])
def test_smollm_outputs_identical_across_configurations(
    smollm_engine: Any, prompts: list[list[int]], reference: list[list[int]], case: tuple[Any, ...]
) -> None:
    assert run_case(smollm_engine, prompts, case) == reference


def assert_retractions_keep_outputs(engine: Any, prompts: list[list[int]], page: int) -> None:
    expected = plain_outputs(engine, prompts, RETRACT)
    tight = engine.with_args(max_total_tokens=1024, page_size=page, chunked_prefill_size=64)
    try:
        outs = tight.generate(input_ids=prompts, sampling_params=RETRACT)
        assert sum(o["meta_info"]["total_retractions"] for o in outs) > 0
        assert [o["output_ids"] for o in outs] == expected
        tight.scheduler.check_memory_invariant()
    finally:
        tight.shutdown()


@pytest.mark.parametrize("page_size", [1, 16])
def test_small_pool_forces_retractions_without_changing_outputs(
    tiny_engine: Any, page_size: int
) -> None:
    assert_retractions_keep_outputs(tiny_engine, tiny_prompts(), page_size)


def test_smollm_small_pool_retractions_keep_outputs(
    smollm_engine: Any, prompts: list[list[int]]
) -> None:
    assert_retractions_keep_outputs(smollm_engine, prompts, 16)
