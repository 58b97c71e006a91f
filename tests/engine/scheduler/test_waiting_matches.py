"""Waiting requests are matched read-only: ordering (lpm, dfs-weight) and refused admissions
neither split the tree nor count LFU hits nor lock; an admission does each exactly once."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from radixserve.engine.mem_cache.allocator import create_allocator
from radixserve.engine.mem_cache.memory_pool import ReqToTokenPool
from radixserve.engine.mem_cache.radix_cache import RadixCache
from radixserve.engine.mem_cache.tree_node import TreeNode
from radixserve.engine.sampling import SamplingParams
from radixserve.engine.scheduler.prefill_adder import AddReqResult, PrefillAdder, PrefillBudget
from radixserve.engine.scheduler.prefix_match import StepPrefixMatches
from radixserve.engine.scheduler.req import Req, StopCriteria
from radixserve.engine.scheduler.schedule_policy import SchedulePolicy

CPU = torch.device("cpu")
X = list(range(1, 41))  # cached
B = X[:30] + list(range(200, 210))  # its match ends inside X's node
C = list(range(100, 120))  # nothing cached (all ids < the tiny vocabulary)


def make_req(ids: list[int], rid: str, max_new: int = 4) -> Req:
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new, ignore_eos=True)
    return Req(
        rid=rid, origin_input_ids=list(ids), sampling_params=params, stop=StopCriteria(frozenset())
    )


def make_cache(pool: int = 512) -> RadixCache:
    cache = RadixCache(ReqToTokenPool(4, 512, CPU), create_allocator(pool, 1, CPU), 1, "lfu")
    slots = cache.allocator.alloc_extend([0], [len(X)], [-1])
    assert slots is not None
    cache.insert(list(X), slots)
    return cache


def nodes(cache: RadixCache) -> list[TreeNode]:
    out, stack = [], list(cache.root.children.values())
    while stack:
        node = stack.pop()
        out.append(node)
        stack.extend(node.children.values())
    return out


def adder_for(cache: RadixCache, total_budget: int | None = None) -> PrefillAdder:
    adder = PrefillAdder(PrefillBudget(1, 16384, None, 0.7), cache, cache.allocator, [])
    if total_budget is not None:  # leave only `total_budget` tokens for this round
        adder.rem_total_token_offset = adder.rem_total_tokens - total_budget
    return adder


# lpm: the longer cached prefix first; dfs-weight: requests at the root, then down the tree
@pytest.mark.parametrize(("policy", "expected"), [("lpm", "bc"), ("dfs-weight", "cb")])
def test_ordering_many_steps_changes_nothing_in_the_tree(policy: str, expected: str) -> None:
    cache = make_cache()
    b, c = make_req(B, "b"), make_req(C, "c")
    before = [(n.key, n.hit_count, n.lock_ref, n.last_access_time) for n in nodes(cache)]
    for _ in range(5):
        order = SchedulePolicy(policy, cache).calc_priority([c, b], StepPrefixMatches(cache))
        assert "".join(r.rid for r in order) == expected
    assert [(n.key, n.hit_count, n.lock_ref, n.last_access_time) for n in nodes(cache)] == before


def test_admission_splits_counts_one_hit_and_locks() -> None:
    cache = make_cache()
    b = make_req(B, "b")
    matches = StepPrefixMatches(cache)
    SchedulePolicy("lpm", cache).calc_priority([b], matches)
    assert adder_for(cache).add_one_req(b, matches.get(b)) is AddReqResult.CONTINUE
    assert len(nodes(cache)) == 2 and b.last_node.key == X[:30]
    assert b.last_node.hit_count == 1 and b.last_node.lock_ref == 1
    assert b.prefix_indices.numel() == 30 and b.extend_input_len == len(B) - 30
    assert cache.protected_size() == 30


def test_refused_admission_leaves_the_tree_as_it_was() -> None:
    cache = make_cache()
    b = make_req(B, "b", max_new=4)
    adder = adder_for(cache, total_budget=len(B) - 30 + 4)  # fits only without the lock's cost
    assert adder.add_one_req(b) is AddReqResult.NO_TOKEN
    (node,) = nodes(cache)
    assert node.key == X and node.hit_count == 0 and node.lock_ref == 0
    assert b.last_node is None and cache.protected_size() == 0


def test_lock_cost_of_a_peek_stays_right_after_an_earlier_admission_split() -> None:
    cache = make_cache()
    b, d = make_req(B, "b"), make_req(X[:35] + [7777], "d")
    matches = StepPrefixMatches(cache)
    peek_d = matches.get(d)  # peeked before b's admission splits X at 30
    assert cache.evictable_in_match(peek_d) == 35
    adder_for(cache).add_one_req(b, matches.get(b))
    assert cache.evictable_in_match(peek_d) == 5  # X[:30] is now locked by b
    assert cache.evictable_in_match(cache.peek_prefix(d.full_ids()[:-1])) == 5


def test_request_waiting_under_lpm_and_lfu_counts_one_hit(tmp_path: Path) -> None:
    from radixserve.engine import EngineCore
    from tests.engine.models.tiny import save_tiny

    save_tiny("llama", tmp_path, tie_word_embeddings=True)
    args = {"model_path": str(tmp_path), "max_total_tokens": 2048, "disable_overlap_schedule": True}
    engine = EngineCore(
        **args, schedule_policy="lpm", radix_eviction_policy="lfu", max_running_requests=1
    )
    sched = engine.scheduler
    try:
        first = make_req(X, "first", max_new=2)
        sched.add_request(first)
        while sched.has_work():
            sched.step()
        (cached,) = [n for n in nodes(sched.tree_cache) if n.key[:30] == X[:30]]
        runner = make_req(C, "runner", max_new=12)
        sched.add_request(runner)
        sched.step()  # runner is admitted; the only running slot is taken
        waiter = make_req(B, "waiter", max_new=3)
        sched.add_request(waiter)
        hits, key = cached.hit_count, list(cached.key)
        waited = 0
        while waiter in sched.waiting_queue:
            # Ordering splits nothing: the waiter's match still ends inside `cached`.
            assert cached.key == key and cached.parent is sched.tree_cache.root
            sched.step()
            waited += 1
        assert waited >= 5
        # One hit, at admission, which split `cached` at the waiter's 30 matched tokens.
        (upper,) = [n for n in nodes(sched.tree_cache) if n.key == X[:30]]
        assert upper.hit_count == cached.hit_count == hits + 1
        while sched.has_work():
            sched.step()
        sched.check_memory_invariant()
        plain = engine.with_args(disable_radix_cache=True)
        ref = make_req(B, "ref", max_new=3)
        plain.scheduler.add_request(ref)
        while plain.scheduler.has_work():
            plain.scheduler.step()
        assert waiter.output_ids == ref.output_ids and len(ref.output_ids) == 3
        plain.shutdown()
    finally:
        engine.shutdown()
