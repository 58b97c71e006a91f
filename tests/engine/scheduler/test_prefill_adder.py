"""Tests for PrefillAdder's budgets (SGLang's rules), on a real allocator and a ChunkCache."""

from __future__ import annotations

import torch

from radixserve.engine.mem_cache.allocator import BaseTokenAllocator, create_allocator
from radixserve.engine.mem_cache.chunk_cache import ChunkCache
from radixserve.engine.mem_cache.memory_pool import MHATokenToKVPool, ReqToTokenPool
from radixserve.engine.sampling import SamplingParams
from radixserve.engine.scheduler.prefill_adder import (
    CLIP_MAX_NEW_TOKENS,
    AddReqResult,
    PrefillAdder,
    PrefillBudget,
)
from radixserve.engine.scheduler.req import Req, StopCriteria
from radixserve.engine.scheduler.schedule_batch import KVContext, ScheduleBatch

CPU = torch.device("cpu")


def make_req(n_input: int, max_new: int, n_output: int = 0, rid: str = "r") -> Req:
    req = Req(
        rid=rid,
        origin_input_ids=list(range(100, 100 + n_input)),
        sampling_params=SamplingParams(max_new_tokens=max_new),
        stop=StopCriteria(frozenset()),
    )
    req.output_ids = list(range(n_output))
    req.init_next_round_input()
    return req


def make_cache(total: int, page: int = 1) -> tuple[BaseTokenAllocator, ChunkCache]:
    alloc = create_allocator(total, page, CPU)
    return alloc, ChunkCache(ReqToTokenPool(8, 8192, CPU), alloc)


def make_adder(  # noqa: PLR0913 - one knob per budget
    total: int,
    *,
    page: int = 1,
    max_prefill: int = 16384,
    chunk: int | None = None,
    ratio: float = 0.7,
    mixed: int = 0,
    running: list[Req] | None = None,
) -> PrefillAdder:
    alloc, cache = make_cache(total, page)
    budget = PrefillBudget(page, max_prefill, chunk, ratio, mixed)
    return PrefillAdder(budget, cache, alloc, running or [])


# ---- rem_total_tokens: extend + max_new must be strictly below it --------------------------


def test_request_filling_rem_total_exactly_is_refused() -> None:
    adder = make_adder(100)
    req = make_req(60, 40)
    assert adder.add_one_req(req) is AddReqResult.NO_TOKEN
    assert adder.can_run_list == []
    assert adder.rem_total_tokens == 100


def test_request_one_token_below_rem_total_is_admitted() -> None:
    adder = make_adder(100)
    req = make_req(60, 39)
    assert adder.add_one_req(req) is AddReqResult.CONTINUE
    assert adder.can_run_list == [req]
    assert adder.rem_total_tokens == 1  # extend + full max_new reserved
    assert adder.cur_rem_tokens == 40  # only the input counts here


def test_admission_that_page_rounds_budget_to_zero_reports_no_token() -> None:
    adder = make_adder(100, page=4)
    req = make_req(61, 36)  # 97 < 100, but 61 rounds up to 64 → 64 + 36 == 100
    assert adder.add_one_req(req) is AddReqResult.NO_TOKEN
    assert adder.can_run_list == [req]
    assert adder.rem_total_tokens == 0


def test_admission_leaving_budget_positive_continues() -> None:
    adder = make_adder(100, page=4)
    assert adder.add_one_req(make_req(60, 36)) is AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 4


# ---- running requests reserve min(max_new − generated, CLIP) × ratio ------------------------


def test_running_request_reserves_remaining_times_ratio() -> None:
    adder = make_adder(1000, ratio=0.5, running=[make_req(10, 100, n_output=30)])
    assert adder.rem_total_tokens == 1000 - 70 * 0.5
    assert adder.cur_rem_tokens == 1000


def test_running_reservation_boundary() -> None:
    running = [make_req(10, 100, n_output=30)]  # reserves 35
    adder = make_adder(1000, ratio=0.5, running=running)
    assert adder.add_one_req(make_req(900, 65)) is AddReqResult.NO_TOKEN  # 965 >= 965
    assert adder.add_one_req(make_req(900, 64)) is AddReqResult.CONTINUE


def test_running_reservations_sum_over_requests() -> None:
    running = [make_req(5, 20, n_output=5), make_req(5, 10)]
    adder = make_adder(1000, ratio=1.0, running=running)
    assert adder.rem_total_tokens == 1000 - (15 + 10)


def test_running_reservation_is_clipped() -> None:
    adder = make_adder(10000, ratio=0.5, running=[make_req(10, 10000, n_output=1)])
    assert adder.rem_total_tokens == 10000 - CLIP_MAX_NEW_TOKENS * 0.5


def test_running_request_past_its_max_new_reserves_nothing() -> None:
    adder = make_adder(1000, ratio=0.7, running=[make_req(10, 5, n_output=7)])
    assert adder.rem_total_tokens == 1000


# ---- max_prefill_tokens: the first request may exceed it ------------------------------------


def test_first_request_may_exceed_max_prefill_tokens() -> None:
    adder = make_adder(1000, max_prefill=10)
    req = make_req(50, 5)
    assert adder.add_one_req(req) is AddReqResult.OTHER  # admitted, input budget now spent
    assert adder.can_run_list == [req]
    assert adder.rem_input_tokens == 10 - 50


def test_second_request_filling_rem_input_exactly_is_refused() -> None:
    adder = make_adder(1000, max_prefill=10)
    assert adder.add_one_req(make_req(8, 1)) is AddReqResult.CONTINUE
    req = make_req(2, 1)  # 2 >= rem_input_tokens 2
    assert adder.add_one_req(req) is AddReqResult.OTHER
    assert req not in adder.can_run_list
    assert adder.rem_input_tokens == 2


def test_second_request_below_rem_input_is_admitted() -> None:
    adder = make_adder(1000, max_prefill=10)
    adder.add_one_req(make_req(8, 1))
    req = make_req(1, 1)
    assert adder.add_one_req(req) is AddReqResult.CONTINUE
    assert adder.can_run_list[-1] is req
    assert adder.rem_input_tokens == 1


def test_input_budget_uses_page_rounded_length() -> None:
    adder = make_adder(1024, page=4, max_prefill=16)
    adder.add_one_req(make_req(8, 1))  # rem_input 8
    assert adder.add_one_req(make_req(5, 1)) is AddReqResult.OTHER  # rounds to 8 >= 8
    assert adder.add_one_req(make_req(4, 1)) is AddReqResult.CONTINUE
    assert adder.rem_input_tokens == 4


# ---- chunked prefill ------------------------------------------------------------------------


def test_long_request_is_chunked_to_a_page_multiple() -> None:
    adder = make_adder(1024, page=16, chunk=70)
    req = make_req(100, 50)
    assert adder.add_one_req(req) is AddReqResult.CONTINUE  # rem_chunk 70 − 64 = 6
    assert adder.new_chunked_req is req
    assert req.extend_input_len == 64
    assert req.fill_ids == req.origin_input_ids[:64]
    assert adder.rem_chunk_tokens == 6


def test_chunked_request_reserves_no_max_new() -> None:
    adder = make_adder(1024, page=16, chunk=64)
    adder.add_one_req(make_req(100, 50))
    assert adder.rem_total_tokens == 1024 - 64
    assert adder.cur_rem_tokens == 1024 - 64


def test_exhausted_chunk_budget_reports_other() -> None:
    adder = make_adder(1024, page=16, chunk=64)
    assert adder.add_one_req(make_req(65, 1)) is AddReqResult.OTHER  # 65 → 80 > 64: chunked
    assert adder.rem_chunk_tokens == 0


def test_request_whose_rounded_input_equals_chunk_is_admitted_whole() -> None:
    adder = make_adder(1024, page=16, chunk=64)
    req = make_req(61, 10)  # rounds to 64 <= 64
    adder.add_one_req(req)
    assert adder.new_chunked_req is None
    assert req.extend_input_len == 61 and len(req.fill_ids) == 61
    assert adder.rem_total_tokens == 1024 - 64 - 10


def test_chunk_budget_below_one_page_admits_nothing() -> None:
    adder = make_adder(1024, page=16, chunk=16, mixed=1)  # rem_chunk 15 < page
    req = make_req(20, 1)
    assert adder.add_one_req(req) is AddReqResult.OTHER
    assert adder.can_run_list == [] and adder.new_chunked_req is None
    assert req.extend_input_len == 20


def test_add_chunked_req_stays_chunked_when_remainder_exceeds_chunk() -> None:
    adder = make_adder(1024, chunk=64)
    req = make_req(200, 50)
    req.prefix_indices = torch.arange(1, 65)
    req.init_next_round_input()  # 136 left
    assert adder.add_chunked_req(req) is req
    assert req.extend_input_len == 64 and req.fill_ids == req.origin_input_ids[:128]
    assert adder.can_run_list == [req]
    assert adder.rem_total_tokens == 1024 - 64  # no max_new while truncated


def test_add_chunked_req_limited_by_rem_total_rounds_down_to_a_page() -> None:
    adder = make_adder(96, page=16, chunk=1000, ratio=1.0, running=[make_req(1, 7)])
    req = make_req(200, 5)
    req.prefix_indices = torch.arange(16, 64)
    req.init_next_round_input()  # 152 left, rem_total_tokens 96 − 7 = 89
    assert adder.add_chunked_req(req) is req
    assert req.extend_input_len == 80 and len(req.fill_ids) == 48 + 80


def test_add_chunked_req_finishes_and_reserves_max_new() -> None:
    adder = make_adder(1024, chunk=64)
    req = make_req(100, 50)
    req.prefix_indices = torch.arange(1, 65)
    req.init_next_round_input()  # 36 left
    assert adder.add_chunked_req(req) is None
    assert req.extend_input_len == 36 and req.fill_ids == req.origin_input_ids
    assert adder.rem_total_tokens == 1024 - 36 - 50
    assert adder.rem_chunk_tokens == 64 - 36


def test_add_chunked_req_with_zero_chunk_budget_admits_nothing() -> None:
    adder = make_adder(1024, chunk=8, mixed=8)  # rem_chunk_tokens == 0
    req = make_req(100, 10)
    req.prefix_indices = torch.arange(1, 17)
    req.init_next_round_input()
    assert adder.add_chunked_req(req) is req
    assert req not in adder.can_run_list


def test_chunked_request_runs_to_completion_through_real_pools() -> None:
    alloc, cache = make_cache(256)
    kv_pool = MHATokenToKVPool(256, 1, torch.float32, 1, 4, 1, CPU)
    kv = KVContext(cache.req_to_token_pool, kv_pool, alloc, cache)
    budget = PrefillBudget(1, 16384, 64, 0.7)
    req = make_req(150, 20)
    adder = PrefillAdder(budget, cache, alloc, [])
    adder.add_one_req(req)
    chunked, rounds = adder.new_chunked_req, 1
    while True:
        ScheduleBatch(adder.can_run_list, kv).prepare_for_extend()
        if chunked is None:
            break
        cache.cache_unfinished_req(req)
        req.init_next_round_input()
        adder = PrefillAdder(budget, cache, alloc, [])
        chunked, rounds = adder.add_chunked_req(req), rounds + 1
    assert rounds == 3  # 64 + 64 + 22
    assert req.kv_allocated_len == 150 and alloc.available_size() == 256 - 150
    assert adder.rem_total_token_offset == 22 + 20  # last chunk reserves its max_new


# ---- mixed decode tokens and the max_new clip -----------------------------------------------


def test_mixed_decode_tokens_are_charged_against_every_budget() -> None:
    adder = make_adder(100, max_prefill=50, chunk=40, mixed=5)
    assert adder.rem_total_tokens == 95
    assert adder.cur_rem_tokens == 95
    assert adder.rem_input_tokens == 45
    assert adder.rem_chunk_tokens == 35


def test_mixed_decode_tokens_boundary() -> None:
    adder = make_adder(100, mixed=5)
    assert adder.add_one_req(make_req(50, 45)) is AddReqResult.NO_TOKEN  # 95 >= 95
    assert adder.add_one_req(make_req(50, 44)) is AddReqResult.CONTINUE


def test_new_request_max_new_is_clipped() -> None:
    adder = make_adder(5000)
    assert adder.add_one_req(make_req(10, 10000)) is AddReqResult.CONTINUE
    assert adder.rem_total_tokens == 5000 - 10 - CLIP_MAX_NEW_TOKENS


def test_clipped_max_new_boundary() -> None:
    adder = make_adder(5000)
    assert adder.add_one_req(make_req(904, 10000)) is AddReqResult.NO_TOKEN  # 904 + 4096
    assert adder.add_one_req(make_req(903, 10000)) is AddReqResult.CONTINUE
