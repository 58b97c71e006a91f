"""An abort that arrives while a request is prefilled in chunks ends it at the next step: the
rest of its prompt is never computed, the chunks already computed stay in the radix cache as a
prefix, its KV slots are all accounted for once idle, and a later request on the same prefix
hits them. In-process scheduler on a tiny random-weight Llama with 16-token chunks."""

from __future__ import annotations

from typing import Any

import pytest

from tests.engine.models.tiny import random_prompts, save_tiny

CHUNK = 16


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory) -> Any:
    from radixserve.engine import EngineCore

    folder = tmp_path_factory.mktemp("llama")
    save_tiny("llama", folder, seed=2)
    core = EngineCore(model_path=str(folder), dtype="float32", chunked_prefill_size=CHUNK)
    yield core
    core.shutdown()


def _req(engine: Any, rid: str, ids: list[int]) -> Any:
    from radixserve.engine.ipc.messages import TokenizedGenerateReq

    params = {"max_new_tokens": 4, "temperature": 0.0}
    return engine.core.make_req(TokenizedGenerateReq(rid, ids, params))


def test_abort_mid_chunked_prefill_stops_prefilling(engine: Any) -> None:
    sched = engine.scheduler
    (prompt,) = random_prompts((10 * CHUNK,), seed=4)
    req = _req(engine, "long", prompt)
    sched.add_request(req)
    sched.step()
    sched.step()  # two chunks prefilled
    assert sched.chunked_req is req and not req.finished()
    sched.abort_request("long")
    ended = sched.step()
    assert req in ended and req.finished()
    assert req.finished_reason.to_json()["type"] == "abort"
    assert sched.chunked_req is None and not sched.has_work()
    cached = sched.tree_cache.evictable_size()
    assert 2 * CHUNK <= cached < 4 * CHUNK  # not the whole 160-token prompt
    sched.check_memory_invariant()  # every slot is free, cached or protected: none leaked
    again = engine.generate(input_ids=prompt, sampling_params={"max_new_tokens": 2})
    assert again["meta_info"]["cached_tokens"] >= 2 * CHUNK  # the computed chunks were kept
