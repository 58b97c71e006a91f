"""Tests for new_token_ratio (SGLang's constants) and retract_decode's order and stopping."""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.mem_cache.allocator import TokenToKVPoolAllocator
from radixserve.engine.mem_cache.chunk_cache import ChunkCache
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from radixserve.engine.sampling import SamplingParams
from radixserve.engine.scheduler.req import Req, StopCriteria
from radixserve.engine.scheduler.retraction import (
    RETRACT_DECODE_STEPS,
    NewTokenRatio,
    retract_decode,
)
from radixserve.engine.scheduler.schedule_batch import KVContext, ScheduleBatch

CPU = torch.device("cpu")
POOL = 512

# ---- NewTokenRatio --------------------------------------------------------------------------


def test_ratio_defaults() -> None:
    r = NewTokenRatio.create(1.0)
    assert r.init == pytest.approx(0.7) and r.value == r.init
    assert r.floor == pytest.approx(0.098)
    assert r.step == pytest.approx((0.7 - 0.098) / 600)


def test_ratio_conservativeness_is_capped_at_one() -> None:
    r = NewTokenRatio.create(2.0)
    assert r.init == 1.0
    assert r.floor == pytest.approx(0.14)


def test_ratio_one_decay_step() -> None:
    r = NewTokenRatio.create(1.0)
    r.decay()
    assert r.value == pytest.approx(0.7 - (0.7 - 0.098) / 600)


def test_ratio_reaches_floor_after_600_steps_not_before() -> None:
    r = NewTokenRatio.create(1.0)
    for _ in range(599):
        r.decay()
    assert r.value > r.floor + r.step / 2
    r.decay()
    assert r.value == pytest.approx(r.floor)


def test_ratio_never_decays_below_floor() -> None:
    r = NewTokenRatio.create(1.0)
    for _ in range(700):
        r.decay()
    assert r.value == r.floor


def test_ratio_reset_restores_init() -> None:
    r = NewTokenRatio.create(1.0)
    for _ in range(10):
        r.decay()
    r.reset()
    assert r.value == r.init


def _req(rid: str, n_input: int, n_output: int = 0, max_new: int = 100) -> Req:
    req = Req(
        rid=rid,
        origin_input_ids=list(range(1, n_input + 1)),
        sampling_params=SamplingParams(max_new_tokens=max_new),
        stop=StopCriteria(frozenset()),
    )
    req.output_ids = list(range(1000, 1000 + n_output))
    return req


def test_after_retraction_formula() -> None:
    r = NewTokenRatio.create(1.0)
    remaining = [_req("a", 5, n_output=10, max_new=100), _req("b", 5, max_new=50)]
    r.after_retraction(remaining)
    assert r.value == pytest.approx((10 + 0 + RETRACT_DECODE_STEPS * 2) / (100 + 50 + 1))
    assert RETRACT_DECODE_STEPS == 20


def test_after_retraction_is_capped_at_one() -> None:
    r = NewTokenRatio.create(1.0)
    r.after_retraction([_req("a", 5, n_output=15, max_new=16)])
    assert r.value == 1.0


# ---- retract_decode -------------------------------------------------------------------------


class RecordingCache(ChunkCache):
    def __init__(self, pool: ReqToTokenPool, alloc: TokenToKVPoolAllocator) -> None:
        super().__init__(pool, alloc)
        self.evicted: list[int] = []

    def evict(self, num_tokens: int) -> int:
        self.evicted.append(num_tokens)
        return 0


def running_batch(reqs: list[Req]) -> tuple[ScheduleBatch, RecordingCache]:
    """Reqs with their prompt + outputs in real pools, as after their last decode step."""
    alloc = TokenToKVPoolAllocator(POOL, CPU)
    pool = ReqToTokenPool(8, 64, CPU)
    cache = RecordingCache(pool, alloc)
    kv = KVContext(pool, MHATokenToKVPool(POOL, 1, torch.float32, 1, 4, 1, CPU), alloc, cache)
    for r in reqs:
        r.init_next_round_input()
    batch = ScheduleBatch(list(reqs), kv)
    batch.prepare_for_extend()
    return batch, cache


class Fits:
    """`fits` callback: true once the batch is down to `size` requests; counts its calls."""

    def __init__(self, size: int) -> None:
        self.size, self.calls = size, 0

    def __call__(self, batch: ScheduleBatch) -> bool:
        self.calls += 1
        return batch.batch_size <= self.size


def five() -> list[Req]:
    return [
        _req("A", 5, n_output=3),
        _req("B", 5, n_output=1),
        _req("C", 9, n_output=1),
        _req("D", 2, n_output=0),
        _req("E", 1, n_output=2),
    ]


def test_retract_order_fewest_outputs_then_longest_prompt() -> None:
    batch, cache = running_batch(five())
    retracted = retract_decode(batch, cache, Fits(0))
    assert [r.rid for r in retracted] == ["D", "C", "B", "E"]


def test_retract_never_below_one_request() -> None:
    batch, cache = running_batch(five())
    fits = Fits(0)
    retract_decode(batch, cache, fits)
    assert [r.rid for r in batch.reqs] == ["A"]
    assert fits.calls == 4  # not asked again once one request is left


def test_retract_stops_as_soon_as_it_fits() -> None:
    batch, cache = running_batch(five())
    fits = Fits(3)
    retracted = retract_decode(batch, cache, fits)
    assert [r.rid for r in retracted] == ["D", "C"]
    assert fits.calls == 3
    assert [r.rid for r in batch.reqs] == ["A", "B", "E"]  # order of the rest kept


def test_retract_nothing_when_it_already_fits() -> None:
    batch, cache = running_batch(five())
    fits = Fits(5)
    assert retract_decode(batch, cache, fits) == []
    assert fits.calls == 1 and batch.batch_size == 5


def test_retract_single_request_batch_is_left_alone() -> None:
    batch, cache = running_batch([_req("A", 4, n_output=1)])
    fits = Fits(0)
    assert retract_decode(batch, cache, fits) == []
    assert fits.calls == 0 and batch.batch_size == 1


def test_retract_tie_on_outputs_and_prompt_keeps_one() -> None:
    batch, cache = running_batch([_req("X", 4, n_output=1), _req("Y", 4, n_output=1)])
    retracted = retract_decode(batch, cache, Fits(1))
    assert len(retracted) == 1 and batch.batch_size == 1
    assert {retracted[0].rid, batch.reqs[0].rid} == {"X", "Y"}


def test_retract_frees_kv_and_row() -> None:
    batch, cache = running_batch([_req("A", 5, n_output=3), _req("D", 7, n_output=1)])
    alloc, pool = batch.kv.allocator, batch.kv.req_to_token_pool
    assert alloc.available_size() == POOL - 8 - 8
    (d,) = retract_decode(batch, cache, Fits(1))
    assert alloc.available_size() == POOL - 8
    assert pool.available_size() == 8 - 1
    assert d.req_pool_idx is None


def test_retracted_request_is_reset_but_keeps_outputs() -> None:
    batch, cache = running_batch([_req("A", 5, n_output=3), _req("D", 7, n_output=1)])
    (d,) = retract_decode(batch, cache, Fits(1))
    assert d.output_ids == [1000]
    assert d.prefix_indices.numel() == 0 and d.last_node is None
    assert d.kv_allocated_len == 0 and d.extend_input_len == 0 and d.cache_protected_len == 0
    assert d.is_retracted and d.retraction_count == 1
    d.init_next_round_input()
    assert d.extend_input_len == 7 + 1  # prompt + generated are prefilled again


def test_retract_evicts_twenty_tokens_per_remaining_request() -> None:
    batch, cache = running_batch(five())
    retract_decode(batch, cache, Fits(2))
    assert cache.evicted == [n * RETRACT_DECODE_STEPS for n in (4, 3, 2)]
