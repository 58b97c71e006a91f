"""ApproxTree: matches what was routed, LRU-trims leaves to the token budget (tails first), and
never matches more than some routed prompt shares with the query."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixserve.router.mirror.approx import ApproxTree


def lcp(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


P = list(range(100, 106))  # a shared 6-token prefix
A, B = [*P, 1, 1, 1, 1], [*P, 2, 2, 2, 2]
C = list(range(200, 206))


def test_match_is_the_longest_routed_prefix() -> None:
    t = ApproxTree(1000)
    t.insert(A)
    assert [t.match_prefix(q) for q in (A, [*A, 9], P, [*P, 2], [7], [])] == [10, 10, 6, 6, 0, 0]
    t.insert(B)
    assert (t.match_prefix([*P, 2, 2, 9]), t.num_tokens) == (8, 14)
    t.insert(A)  # routed again: nothing new
    assert t.num_tokens == 14


def test_lru_leaves_go_first_and_the_budget_is_kept_exactly() -> None:
    t = ApproxTree(20)
    for prompt in (A, B, C):
        t.insert(prompt)
    assert t.num_tokens == 20  # P + a + b + C
    t.insert(A)  # A is now the most recent; B's leaf is the least recently used
    t.insert([300, 301, 302, 303])  # 4 over budget: B's 4-token leaf goes
    assert t.num_tokens == 20
    assert [t.match_prefix(q) for q in (A, B, C)] == [10, 6, 6]
    t.insert(list(range(400, 408)))  # 8 over: C (6 tokens), then 2 from the tail of A's leaf
    assert t.num_tokens == 20
    assert [t.match_prefix(q) for q in (A, B, C)] == [8, 6, 0]
    assert t.match_prefix([300, 301, 302, 303]) == 4


def test_a_prompt_over_budget_keeps_its_head() -> None:
    t = ApproxTree(5)
    t.insert(list(range(12)))
    assert (t.num_tokens, t.match_prefix(list(range(12)))) == (5, 5)


def test_zero_budget_keeps_nothing_and_bad_budget_names_the_field() -> None:
    t = ApproxTree(0)
    t.insert(A)
    assert (t.num_tokens, t.match_prefix(A)) == (0, 0)
    with pytest.raises(ValueError, match="max_tokens"):
        ApproxTree(-1)
    with pytest.raises(ValueError, match="tokens"):
        t.insert([1, -2])


@settings(max_examples=150, deadline=None)
@given(
    budget=st.integers(1, 40),
    prompts=st.lists(st.lists(st.integers(0, 2), min_size=1, max_size=24), max_size=30),
)
def test_budget_recency_and_no_invented_matches(budget: int, prompts: list[list[int]]) -> None:
    t, routed = ApproxTree(budget), []
    for prompt in prompts:
        t.insert(prompt)
        routed.append(prompt)
        assert t.num_tokens <= budget
        # the prompt just routed is the most recent path: it survives up to the budget
        assert t.match_prefix(prompt) == min(len(prompt), budget)
        for q in routed[-8:]:
            for probe in (q, [*q, 0], q[: len(q) // 2]):
                best = max(lcp(probe, r) for r in routed)
                got = t.match_prefix(probe)
                assert got <= best
                if sum(map(len, routed)) <= budget:  # nothing trimmed yet: exact
                    assert got == best
