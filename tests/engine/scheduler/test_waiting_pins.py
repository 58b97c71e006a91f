"""Pins on the cached prefix of waiting requests (`WaitingPins`, scheduler): a pin locks the
node the match ends in (no split, hit or access time), is bounded by the cap and by the room
the admitted batch leaves, follows a match that grows, and is released on admission, abort,
when the engine is idle and cannot admit, and before a decode would retract. Step by step on
a RadixCache, then in-process on a tiny random-weight Llama (the pool invariant after each),
with `--waiting-prefix-pin-fraction 0.5` (off by default: cap 0 pins nothing)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import torch

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.sampling import SamplingParams
from radixserve.engine.scheduler.prefix_match import StepPrefixMatches, WaitingPins
from radixserve.engine.scheduler.req import Req, StopCriteria
from radixserve.engine.scheduler.schedule_batch import ScheduleBatch
from tests.engine.models.tiny import save_tiny

CPU = torch.device("cpu")
X = list(range(1, 41))  # cached: one node of 40 tokens
Y = list(range(50, 90))  # cached: another
INF = float("inf")


def make_req(ids: list[int], rid: str, max_new: int = 4) -> Req:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
    return Req(
        rid=rid, origin_input_ids=list(ids), sampling_params=params, stop=StopCriteria(frozenset())
    )


def put(cache: RadixCache, tokens: list[int]) -> None:
    slots = cache.allocator.alloc_extend([0], [len(tokens)], [-1])
    assert slots is not None
    cache.allocator.free(slots[: cache.insert(list(tokens), slots)])


def make_cache(pool: int = 256) -> RadixCache:
    cache = RadixCache(ReqToTokenPool(4, 512, CPU), create_allocator(pool, 1, CPU), 1, "lru")
    put(cache, X)
    put(cache, Y)
    return cache


def node_of(cache: RadixCache, first: int) -> Any:
    return cache.root.children[first]


def test_a_pin_locks_the_match_without_split_hit_or_access_time() -> None:
    cache = make_cache()
    x = node_of(cache, 1)
    before = (list(x.key), x.hit_count, x.last_access_time)
    waiter = make_req(X[:30] + [200, 201], "w")  # its match (30) ends inside X's node
    pins = WaitingPins(cache, 1000)
    pins.refresh([waiter], StepPrefixMatches(cache), INF)
    assert (list(x.key), x.hit_count, x.last_access_time) == before and x.lock_ref == 1
    assert pins.match_of(waiter) == 30 and pins.pinned_tokens == 40  # the whole node
    assert (cache.evictable_size(), cache.protected_size()) == (40, 40)
    assert cache.evict(1000) == 40  # Y goes, X stays
    assert cache.match_prefix(X).indices.numel() == 40
    pins.release(waiter)
    assert (cache.evictable_size(), cache.protected_size(), len(pins)) == (40, 0, 0)


def test_the_cap_bounds_the_pinned_tokens_in_priority_order() -> None:
    cache = make_cache()
    a, b = make_req([*X, 7], "a"), make_req([*Y, 7], "b")
    pins = WaitingPins(cache, 60)
    pins.refresh([b, a], StepPrefixMatches(cache), INF)  # b first: it takes the cap
    assert (pins.match_of(b), pins.match_of(a), pins.pinned_tokens) == (40, 0, 40)
    assert node_of(cache, 50).lock_ref == 1 and node_of(cache, 1).lock_ref == 0


def test_a_pin_never_takes_the_room_the_admitted_batch_needs() -> None:
    cache = make_cache()
    a = make_req([*X, 7], "a")
    pins = WaitingPins(cache, 1000)
    pins.refresh([a], StepPrefixMatches(cache), 39)  # 40 evictable tokens > 39 of room
    assert len(pins) == 0 and cache.protected_size() == 0
    pins.refresh([a], StepPrefixMatches(cache), 40)
    assert pins.match_of(a) == 40


def test_pins_follow_a_growing_match_and_go_when_the_request_stops_waiting() -> None:
    cache = make_cache()
    w = make_req([*X, 41, 42, 43], "w")
    pins = WaitingPins(cache, 1000)
    pins.refresh([w], StepPrefixMatches(cache), INF)
    put(cache, [*X, 41, 42])  # another request cached more of w's prompt
    pins.refresh([w], StepPrefixMatches(cache), INF)
    deeper = node_of(cache, 1).children[41]
    assert pins.match_of(w) == 42 and deeper.lock_ref == 1 and node_of(cache, 1).lock_ref == 1
    assert cache.protected_size() == 42 and pins.pinned_tokens == 42
    pins.refresh([], StepPrefixMatches(cache), INF)  # admitted or aborted: unpinned
    assert (len(pins), pins.pinned_tokens, cache.protected_size()) == (0, 0, 0)


# ---- the scheduler ------------------------------------------------------------------------------


@pytest.fixture
def engine(tmp_path: Any) -> Iterator[Any]:
    from radixserve.engine import EngineCore

    save_tiny("llama", tmp_path, seed=3)
    core = EngineCore(
        model_path=str(tmp_path), dtype="float32", max_total_tokens=256,
        schedule_policy="fcfs", max_running_requests=1, disable_overlap_schedule=True,
        waiting_prefix_pin_fraction=0.5,
    )  # fmt: skip
    yield core
    core.shutdown()


def run(engine: Any, reqs: list[Req]) -> None:
    for req in reqs:
        engine.scheduler.add_request(req)
    while engine.scheduler.has_work():
        engine.scheduler.step()
        assert engine.scheduler.pins.pinned_tokens <= engine.scheduler.pins.cap_tokens


P = list(range(100, 200))  # the waiting request's prefix, 100 tokens
R = list(range(1, 61))  # a runner's prompt
C = [*range(200, 256), *range(0, 64)]  # a cold prompt of 120 tokens (ids < the vocabulary)


def test_a_waiting_requests_prefix_survives_a_cold_admission_ahead_of_it(engine: Any) -> None:
    sched = engine.scheduler
    run(engine, [make_req(P, "first", max_new=2)])  # P is cached, least recently used
    runner, cold, warm = make_req(R, "runner"), make_req(C, "cold"), make_req([*P, 5, 6], "warm")
    sched.add_request(runner)
    sched.step()  # runner admitted: the only running slot
    sched.add_request(cold)
    sched.add_request(warm)
    sched.step()  # both wait (fcfs: cold first); warm's prefix gets pinned
    assert sched.pins.match_of(warm) == len(P) and sched.pins.match_of(cold) == 0
    run(engine, [])  # cold's 120 slots come from the runner's cache, not from P
    assert warm.cached_tokens == len(P) and cold.cached_tokens == 0
    assert len(sched.pins) == 0
    sched.check_memory_invariant()


def test_an_idle_engine_drops_the_pins_that_keep_its_head_request_out(engine: Any) -> None:
    sched = engine.scheduler
    run(engine, [make_req(P, "first", max_new=2), make_req(R, "second", max_new=2)])
    big = make_req(list(range(0, 200)), "big")  # needs more than what is free + unpinned
    warm = make_req([*P, 5, 6], "warm")
    sched.add_request(big)
    sched.add_request(warm)
    sched.pins.refresh([warm], StepPrefixMatches(sched.tree_cache), INF)
    free = sched.kv.allocator.available_size() + sched.tree_cache.evictable_size()
    assert free < 200 + 4 < free + sched.pins.pinned_tokens
    sched.step()  # big cannot fit beside the pin and nothing runs: the pin goes, big runs
    assert sched.last_batch is not None and sched.last_batch.reqs == [big]
    assert len(sched.pins) == 0  # and warm's is not taken back from big's room
    run(engine, [])
    assert big.finished() and warm.finished()
    sched.check_memory_invariant()


def test_a_decode_takes_pinned_slots_before_it_retracts(engine: Any) -> None:
    sched = engine.scheduler
    run(engine, [make_req(P, "first", max_new=2)])
    runner = make_req(R, "runner", max_new=8)
    sched.add_request(runner)
    sched.step()  # admitted and prefilled
    warm = make_req([*P, 5, 6], "warm")
    sched.add_request(warm)
    sched.pins.refresh([warm], StepPrefixMatches(sched.tree_cache), INF)
    sched.tree_cache.evict(10**6)  # only pinned or running tokens stay
    free = sched.kv.allocator.available_size()
    hold = sched.kv.allocator.alloc_extend([0], [free], [-1])  # nothing free
    assert hold is not None and sched.tree_cache.evictable_size() == 0
    # the decode of the runner needs a slot: the pin goes, P's tail feeds the decode
    assert sched._decode_mem_ok(ScheduleBatch([runner], sched.kv))
    assert len(sched.pins) == 0 and sched.total_retractions == 0
    sched.kv.allocator.free(hold)
    run(engine, [])
    assert runner.finished() and warm.finished() and sched.total_retractions == 0
    sched.check_memory_invariant()


def test_an_aborted_waiting_request_drops_its_pin(engine: Any) -> None:
    sched = engine.scheduler
    run(engine, [make_req(P, "first", max_new=2)])
    runner, warm = make_req(R, "runner"), make_req([*P, 5, 6], "warm")
    sched.add_request(runner)
    sched.step()
    sched.add_request(warm)
    sched.step()
    assert sched.pins.match_of(warm) == len(P) and sched.tree_cache.protected_size() > len(P)
    assert sched.abort_request("warm") == [warm]
    assert len(sched.pins) == 0 and sched.pins.pinned_tokens == 0
    run(engine, [])
    sched.check_memory_invariant()


def test_pins_are_off_by_default(tmp_path: Any) -> None:
    from radixserve.engine import EngineCore

    save_tiny("llama", tmp_path, seed=3)
    core = EngineCore(
        model_path=str(tmp_path), dtype="float32", max_total_tokens=256,
        schedule_policy="fcfs", max_running_requests=1, disable_overlap_schedule=True,
    )  # fmt: skip
    try:
        sched = core.scheduler
        run(core, [make_req(P, "first", max_new=2)])
        sched.add_request(make_req(R, "runner"))
        sched.step()
        warm = make_req([*P, 5, 6], "warm")
        sched.add_request(warm)
        sched.step()
        assert warm in sched.waiting_queue and len(sched.pins) == 0
        assert sched.pins.cap_tokens == 0 and sched.tree_cache.protected_size() < len(P)
        run(core, [])
        sched.check_memory_invariant()
    finally:
        core.shutdown()


def test_the_pin_fraction_is_checked_by_name() -> None:
    from radixserve.engine.configs.server_args import ServerArgs

    with pytest.raises(ValueError, match="waiting_prefix_pin_fraction"):
        ServerArgs(model_path="x", waiting_prefix_pin_fraction=1.5)
