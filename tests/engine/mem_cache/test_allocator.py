"""Tests for the KV slot allocators: exact counts at the boundaries, slot/page 0 reserved,
partial-page continuation, and all-or-nothing allocation."""

from __future__ import annotations

import pytest
import torch

from radixserve.engine.mem_cache.allocator import (
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    create_allocator,
)

CPU = torch.device("cpu")
PAGES = [4, 16]


def _ceil_div(n: int, d: int) -> int:
    return -(-n // d)


# ---- page size 1 ---------------------------------------------------------------------------


def test_slot_zero_never_handed_out() -> None:
    a = TokenToKVPoolAllocator(8, CPU)
    got = a.alloc(8)
    assert got is not None
    assert sorted(got.tolist()) == list(range(1, 9))


def test_alloc_exactly_the_remaining_size_succeeds() -> None:
    a = TokenToKVPoolAllocator(10, CPU)
    assert a.alloc(3) is not None
    out = a.alloc(7)
    assert out is not None and out.numel() == 7
    assert a.available_size() == 0


def test_alloc_when_empty_returns_none() -> None:
    a = TokenToKVPoolAllocator(10, CPU)
    a.alloc(10)
    assert a.alloc(1) is None


def test_alloc_one_more_than_available_returns_none_and_takes_nothing() -> None:
    a = TokenToKVPoolAllocator(10, CPU)
    a.alloc(4)
    assert a.alloc(7) is None
    assert a.available_size() == 6
    assert a.alloc(6) is not None  # the 6 are still all there


def test_free_then_realloc_gets_the_freed_slots_back() -> None:
    a = TokenToKVPoolAllocator(4, CPU)
    first = a.alloc(4)
    assert first is not None
    a.free(first[1:3])
    assert a.available_size() == 2
    again = a.alloc(2)
    assert again is not None
    assert sorted(again.tolist()) == sorted(first[1:3].tolist())
    assert a.alloc(1) is None


def test_available_size_accounting_over_a_sequence() -> None:
    a = TokenToKVPoolAllocator(20, CPU)
    assert a.available_size() == 20
    a.free(torch.empty(0, dtype=torch.int64))
    assert a.available_size() == 20
    x, y = a.alloc(5), a.alloc(8)
    assert x is not None and y is not None
    assert a.available_size() == 7
    a.free(x)
    assert a.available_size() == 12
    a.free(y)
    assert a.available_size() == 20


def test_alloc_extend_takes_sum_of_extend_lengths() -> None:
    a = TokenToKVPoolAllocator(20, CPU)
    out = a.alloc_extend([2, 0, 7], [5, 3, 7], [-1, -1, -1])
    assert out is not None and out.numel() == 3 + 3 + 0
    assert a.available_size() == 14


def test_decode_takes_one_slot_per_request() -> None:
    a = TokenToKVPoolAllocator(20, CPU)
    out = a.alloc_extend([4, 8, 0], [5, 9, 1], [4, 8, -1])  # a decode: one position each
    assert out is not None and out.numel() == 3
    assert a.available_size() == 17


def test_clear_restores_every_slot() -> None:
    a = TokenToKVPoolAllocator(6, CPU)
    a.alloc(6)
    a.clear()
    assert a.available_size() == 6
    got = a.alloc(6)
    assert got is not None and sorted(got.tolist()) == list(range(1, 7))


# ---- paged ---------------------------------------------------------------------------------


def _pages(slots: torch.Tensor, ps: int) -> set[int]:
    return set((slots // ps).tolist())


@pytest.mark.parametrize("ps", PAGES)
def test_paged_page_zero_never_handed_out(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    out = a.alloc_extend([0], [ps * 8], [-1])
    assert out is not None
    assert sorted(out.tolist()) == list(range(ps, ps * 9))
    assert a.available_size() == 0


@pytest.mark.parametrize("ps", PAGES)
def test_paged_alloc_from_prefix_zero_starts_each_request_on_a_page(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    lens = [ps + 1, 2 * ps, 1]
    out = a.alloc_extend([0, 0, 0], lens, [-1, -1, -1])
    assert out is not None and out.numel() == sum(lens)
    starts = [0, lens[0], lens[0] + lens[1]]
    for start, n in zip(starts, lens, strict=True):
        req = out[start : start + n]
        assert int(req[0]) % ps == 0
        # positions within one page are consecutive slots
        for page_start in range(0, n, ps):
            chunk = req[page_start : page_start + ps]
            assert chunk.tolist() == list(range(int(chunk[0]), int(chunk[0]) + chunk.numel()))
    # no page is shared between two requests
    per_req = [_pages(out[s : s + n], ps) for s, n in zip(starts, lens, strict=True)]
    assert sum(len(p) for p in per_req) == len(set().union(*per_req)) == 2 + 2 + 1
    assert a.available_size() == ps * (8 - 5)


@pytest.mark.parametrize("ps", PAGES)
def test_paged_continuation_fills_the_partial_page_first(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    prefix = ps + 2
    first = a.alloc_extend([0], [prefix], [-1])
    assert first is not None
    last = int(first[-1])
    seq = 3 * ps + 1
    out = a.alloc_extend([prefix], [seq], [last])
    assert out is not None and out.numel() == seq - prefix
    fill = ps - prefix % ps  # slots left in the partially filled page
    assert out[:fill].tolist() == list(range(last + 1, last + 1 + fill))
    assert int(out[fill - 1]) // ps == last // ps
    assert int(out[fill]) % ps == 0  # then a fresh page
    assert int(out[fill]) // ps not in _pages(first, ps)


@pytest.mark.parametrize("ps", PAGES)
# (prefix, seq) as (pages, extra tokens) pairs, so that both page sizes hit the same boundaries
@pytest.mark.parametrize(
    ("prefix_at", "seq_at"),
    [((0, 0), (0, 1)), ((0, 1), (0, 2)), ((0, 1), (1, 0)), ((0, 1), (1, 1)), ((1, -1), (1, 0)),
     ((1, 0), (1, 1)), ((1, 0), (2, 0)), ((0, 3), (3, 1)), ((2, 0), (2, 0))],
)  # fmt: skip
def test_paged_pages_consumed_per_request(
    ps: int, prefix_at: tuple[int, int], seq_at: tuple[int, int]
) -> None:
    prefix, seq = prefix_at[0] * ps + prefix_at[1], seq_at[0] * ps + seq_at[1]
    a = PagedTokenToKVPoolAllocator(ps * 16, ps, CPU)
    last = -1
    if prefix:
        pre = a.alloc_extend([0], [prefix], [-1])
        assert pre is not None
        last = int(pre[-1])
    before = a.available_size()
    out = a.alloc_extend([prefix], [seq], [last])
    assert out is not None and out.numel() == seq - prefix
    pages = _ceil_div(seq, ps) - _ceil_div(prefix, ps)
    assert before - a.available_size() == pages * ps


@pytest.mark.parametrize("ps", PAGES)
def test_paged_batch_consumes_sum_of_per_request_pages(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 16, ps, CPU)
    prefixes, seqs, lasts = [0, ps + 1, 2 * ps], [2 * ps + 1, 2 * ps, 2 * ps + 3], []
    for p in prefixes:
        pre = a.alloc_extend([0], [p], [-1]) if p else None
        lasts.append(int(pre[-1]) if pre is not None else -1)
    before = a.available_size()
    out = a.alloc_extend(prefixes, seqs, lasts)
    assert out is not None and out.numel() == (2 * ps + 1) + (ps - 1) + 3
    assert before - a.available_size() == (3 + 0 + 1) * ps  # Σ ceil(seq/ps) − ceil(prefix/ps)
    second = out[2 * ps + 1 : 3 * ps]  # the second request only fills its partial page
    assert second.tolist() == list(range(lasts[1] + 1, lasts[1] + ps))


@pytest.mark.parametrize("ps", PAGES)
def test_paged_exact_remaining_pages_succeeds(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 4, ps, CPU)
    a.alloc_extend([0], [ps], [-1])
    out = a.alloc_extend([0, 0], [ps + 1, ps], [-1, -1])  # 2 + 1 pages == 3 free
    assert out is not None
    assert a.available_size() == 0


@pytest.mark.parametrize("ps", PAGES)
def test_paged_short_by_one_page_returns_none_and_takes_nothing(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 4, ps, CPU)
    a.alloc_extend([0], [ps], [-1])  # 3 pages left
    assert a.alloc_extend([0, 0], [2 * ps + 1, ps], [-1, -1]) is None  # needs 3 + 1
    assert a.available_size() == 3 * ps
    out = a.alloc_extend([0], [3 * ps], [-1])
    assert out is not None and out.numel() == 3 * ps


@pytest.mark.parametrize("ps", PAGES)
def test_paged_free_returns_whole_pages(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    out = a.alloc_extend([0], [ps + 1], [-1])  # two pages, the second holding one token
    assert out is not None
    assert a.available_size() == 6 * ps
    a.free(out)
    assert a.available_size() == 8 * ps
    again = a.alloc_extend([0], [8 * ps], [-1])
    assert again is not None and set(out.tolist()) <= set(again.tolist())


@pytest.mark.parametrize("ps", PAGES)
def test_paged_decode_at_page_boundary_takes_a_new_page(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    pre = a.alloc_extend([0], [ps], [-1])  # exactly one full page
    assert pre is not None
    before = a.available_size()
    out = a.alloc_extend([ps], [ps + 1], [int(pre[-1])])  # new token at position ps
    assert out is not None and out.numel() == 1
    assert int(out[0]) % ps == 0
    assert int(out[0]) // ps != int(pre[-1]) // ps
    assert before - a.available_size() == ps


@pytest.mark.parametrize("ps", PAGES)
def test_paged_decode_inside_a_page_takes_no_page(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    pre = a.alloc_extend([0], [ps - 1], [-1])  # last slot of the page still free
    assert pre is not None
    before = a.available_size()
    out = a.alloc_extend([ps - 1], [ps], [int(pre[-1])])  # position ps − 1
    assert out is not None and out.tolist() == [int(pre[-1]) + 1]
    assert a.available_size() == before


@pytest.mark.parametrize("ps", PAGES)
def test_paged_decode_inside_a_page_succeeds_with_no_free_pages(ps: int) -> None:
    a = PagedTokenToKVPoolAllocator(ps * 2, ps, CPU)
    pre = a.alloc_extend([0], [ps + 1], [-1])
    assert pre is not None and a.available_size() == 0
    assert a.alloc_extend([ps + 1], [ps + 2], [int(pre[-1])]) is not None
    assert a.alloc_extend([2 * ps], [2 * ps + 1], [int(pre[-1]) + ps - 1]) is None


def test_paged_decode_batch_counts_only_boundary_requests() -> None:
    ps = 4
    a = PagedTokenToKVPoolAllocator(ps * 8, ps, CPU)
    r1 = a.alloc_extend([0], [4], [-1])  # next position 4: boundary
    r2 = a.alloc_extend([0], [5], [-1])  # next position 5: inside
    assert r1 is not None and r2 is not None
    before = a.available_size()
    out = a.alloc_extend([4, 5], [5, 6], [int(r1[-1]), int(r2[-1])])
    assert out is not None
    assert int(out[1]) == int(r2[-1]) + 1
    assert before - a.available_size() == ps


@pytest.mark.parametrize("ps", PAGES)
def test_paged_size_not_multiple_of_page_raises(ps: int) -> None:
    with pytest.raises(ValueError, match="page_size"):
        PagedTokenToKVPoolAllocator(ps * 8 + 1, ps, CPU)


def test_create_allocator_page_one_is_token_allocator() -> None:
    a = create_allocator(16, 1, CPU)
    assert type(a) is TokenToKVPoolAllocator
    assert a.page_size == 1 and a.available_size() == 16


@pytest.mark.parametrize("ps", PAGES)
def test_create_allocator_paged(ps: int) -> None:
    a = create_allocator(ps * 4, ps, CPU)
    assert type(a) is PagedTokenToKVPoolAllocator
    assert a.page_size == ps and a.available_size() == ps * 4


@pytest.mark.parametrize("ps", [0, -1])
def test_create_allocator_rejects_page_below_one(ps: int) -> None:
    with pytest.raises(ValueError, match="page_size"):
        create_allocator(16, ps, CPU)


def test_create_allocator_size_not_multiple_raises() -> None:
    with pytest.raises(ValueError):
        create_allocator(18, 4, CPU)
