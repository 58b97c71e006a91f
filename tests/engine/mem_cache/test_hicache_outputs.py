"""HiCache end to end in the scheduler: tenants' system prompts that outgrow the KV pool are
demoted to the host tier (and to storage), loaded back on a later match, and the greedy
answers are the same tokens as recomputing every prompt (float32 SmolLM2; the oracle is the
same engine with no prefix cache at all)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from radixserve.engine.mem_cache.hiradix_cache import HiRadixCache
from radixserve.engine.tokenizer.metrics import EngineMetrics

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
TENANTS = 6
POOL = 512  # tokens: the six system prompts (about 120 tokens each) need 1.4 times it
QUESTIONS = [
    "What do you do?", "Say hello.", "Name a color.", "Count to three.",
    "What is two plus two?", "Give me a word.", "Who are you?", "Tell a fact.",
]  # fmt: skip


def system_prompt(i: int) -> str:
    topic = ["tides", "bread", "comets", "violins", "bridges", "moss"][i]
    return (
        f"You are assistant {i}, an expert on {topic}. "
        + f"Always answer briefly and mention {topic} when you can. " * 10
    )


def prompts(tokenizer: Any) -> list[list[int]]:
    """16 requests: each tenant's system prompt plus a question, tenants interleaved."""
    out = []
    for k in range(16):
        tenant, question = k % TENANTS, QUESTIONS[k % len(QUESTIONS)]
        out.append(list(tokenizer.encode(system_prompt(tenant) + "\nUser: " + question)))
    return out


@pytest.fixture(scope="module")
def expected(smollm_engine: Any) -> Iterator[tuple[list[list[int]], list[list[int]]]]:
    cold = smollm_engine.with_args(disable_radix_cache=True, max_total_tokens=4096)
    ids = prompts(smollm_engine.tokenizer)
    outs = cold.generate(input_ids=ids, sampling_params=GREEDY)
    cold.core.close()
    yield ids, [o["output_ids"] for o in outs]


def run(engine: Any, ids: list[list[int]], order: list[int]) -> tuple[list[list[int]], int]:
    """One request at a time, in `order`: answers by prompt index, and cached tokens."""
    answers: dict[int, list[int]] = {}
    cached = 0
    for i in order:
        out = engine.generate(input_ids=ids[i], sampling_params=GREEDY)
        answers[i] = out["output_ids"]
        cached += out["meta_info"]["cached_tokens"]
    return [answers[i] for i in range(len(ids))], cached


def scraped_hits(engine: Any) -> dict[str, float]:
    """The replica's /metrics text, as the tokenizer manager renders it, parsed by
    prometheus_client: hit tokens per tier."""
    text = EngineMetrics("m").render([engine.scheduler.load()]).decode()
    family = next(
        f for f in text_string_to_metric_families(text) if f.name == "radixserve:hicache_hit_tokens"
    )
    return {s.labels["tier"]: s.value for s in family.samples if s.name.endswith("_total")}


REVISIT = [15, 2, 9, 0, 12, 7, 4, 11, 1, 14, 6, 3, 10, 5, 13, 8]


def test_prefixes_loaded_back_from_host_give_the_same_answers(
    smollm_engine: Any, expected: Any
) -> None:
    """Page size 1 here; the storage test below runs page size 16 (the unit tests both)."""
    ids, want = expected
    engine = smollm_engine.with_args(
        max_total_tokens=POOL, page_size=1, enable_hierarchical_cache=True,
        hicache_ratio=4.0,
    )  # fmt: skip
    try:
        cache = engine.scheduler.tree_cache
        assert isinstance(cache, HiRadixCache)
        first, _ = run(engine, ids, list(range(16)))
        assert first == want
        assert cache.tier_sizes()["host"] > 0  # the pool overflowed into the host tier
        before = cache.stats.host_hit_tokens
        again, cached = run(engine, ids, REVISIT)
        assert again == want
        host_hits = cache.stats.host_hit_tokens - before
        assert host_hits > 0
        assert cached >= host_hits  # loaded pages count as cached
        batch = engine.generate(input_ids=ids, sampling_params=GREEDY)  # all 16 at once
        assert [o["output_ids"] for o in batch] == want
        engine.scheduler.check_memory_invariant()
        hits = scraped_hits(engine)
        assert hits == {
            "device": cache.stats.device_hit_tokens,
            "host": cache.stats.host_hit_tokens,
            "storage": 0,
        }
    finally:
        engine.core.close()


def test_a_second_replica_reuses_the_first_ones_storage(
    smollm_engine: Any, expected: Any, tmp_path: Path
) -> None:
    ids, want = expected
    # SGLang's default policy (timeout); a threshold under the ~120-token system prompts
    config = f'{{"file_storage_path": "{tmp_path}", "prefetch_threshold": 64}}'
    args = {
        "max_total_tokens": POOL, "page_size": 16, "enable_hierarchical_cache": True,
        "hicache_ratio": 1.0, "hicache_storage_backend": "file",
        "hicache_storage_backend_extra_config": config,
    }  # fmt: skip
    first = smollm_engine.with_args(**args)
    try:
        assert run(first, ids, list(range(16)))[0] == want
        storage = first.scheduler.tree_cache.storage
        storage.flush()
        assert list(tmp_path.glob("*.bin"))
    finally:
        first.core.close()
    second = smollm_engine.with_args(**args)  # a fresh replica: nothing on device or host
    try:
        answers, cached = run(second, ids, REVISIT)
        assert answers == want
        hits = second.scheduler.tree_cache.stats.storage_hit_tokens
        assert hits >= TENANTS * 96  # each tenant's system prompt came from storage once
        assert second.scheduler.tree_cache.stats.prefetch_tokens >= hits  # read ahead
        cache = second.scheduler.tree_cache
        assert cache.prefetches_in_flight() == 0  # every read went with its request
        assert cache.prefetcher.staged_bytes() == 0
        assert cached >= hits
        second.scheduler.check_memory_invariant()
    finally:
        second.core.close()
