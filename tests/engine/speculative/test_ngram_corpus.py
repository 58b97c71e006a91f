"""NgramCorpus: drafts are the continuation of the longest matching suffix, newest first,
never the request's own suffix, bounded by capacity."""

from __future__ import annotations

from radixserve.engine.speculative import NgramConfig, NgramCorpus


def corpus(**kw: int) -> NgramCorpus:
    return NgramCorpus(NgramConfig(**{"min_window": 1, "max_window": 4, **kw}))


def test_continuation_of_an_earlier_occurrence_in_the_same_request() -> None:
    c = corpus()
    ids = [1, 2, 3, 4, 5, 9, 9, 1, 2, 3]
    c.sync("a", ids)
    assert c.propose(ids, 3) == [4, 5, 9]
    assert c.propose(ids, 10) == [4, 5, 9, 9, 1, 2, 3]  # up to the sequence's end


def test_own_suffix_never_matches_itself() -> None:
    c = corpus()
    c.sync("a", [7, 8, 9])
    assert c.propose([7, 8, 9], 4) == []  # 9 (and 8 9, 7 8 9) was never followed


def test_longest_match_wins_over_a_newer_shorter_one() -> None:
    c = corpus()
    c.sync("old", [1, 2, 3, 40, 41])
    c.sync("new", [5, 3, 50, 51])  # "3" newer, but "2 3" only in "old"
    assert c.propose([9, 2, 3], 2) == [40, 41]
    assert c.propose([9, 9, 3], 2) == [50, 51]  # only "3" matches: the newest


def test_other_requests_text_is_drafted_from_and_sync_extends() -> None:
    c = corpus(min_window=2)
    c.sync("a", [1, 2, 3])
    assert c.propose([8, 1, 2], 1) == [3]
    c.sync("a", [1, 2, 3, 4, 5])  # the request went on: only the new tokens are indexed
    assert len(c) == 5
    assert c.propose([2, 3], 3) == [4, 5]
    assert c.propose([7, 3], 3) == []  # below the minimum window


def test_a_rewritten_sequence_starts_over() -> None:
    c = corpus()
    c.sync("a", [1, 2, 3, 4])
    c.sync("a", [1, 2, 6])  # e.g. the rid came back with another prompt
    assert len(c) == 3
    assert c.propose([0, 1, 2], 1) == [6]
    assert c.propose([0, 3], 1) == []  # "3 → 4" left with the old sequence


def test_capacity_drops_the_oldest_sequences() -> None:
    c = corpus(capacity=8)
    c.sync("a", [1, 2, 3, 4])
    c.sync("b", [5, 6, 7, 8])
    c.sync("c", [9, 10, 11])  # 11 tokens > 8: "a" goes
    assert len(c) == 7
    assert c.propose([1, 2], 2) == []
    assert c.propose([5, 6], 2) == [7, 8]
    for i in range(200):  # many sequences: the index is rebuilt, never grows without bound
        c.sync(f"s{i}", [i, i + 1, i + 2])
    assert len(c) <= 8
    assert len(c._index) <= 2 * 4 * 8 + 4 * 3


def test_the_request_s_own_text_first_at_each_length() -> None:
    c = corpus()
    c.sync("me", [1, 2, 3, 10, 11, 1, 2])
    c.sync("other", [5, 2, 20, 21])  # "2" newer elsewhere, followed by 20
    me = [1, 2, 3, 10, 11, 1, 2]
    assert c.propose(me, 2, "me") == [3, 10]  # "1 2" (and "2") in its own text: its own
    assert c.propose(me, 2) == [3, 10]  # the longest match is its own anyway
    c.sync("other", [5, 2, 20, 21, 9, 1, 2, 30])  # now "1 2" is newer in "other"
    assert c.propose(me, 2) == [30]  # without a key: the newest anywhere
    assert c.propose(me, 2, "me") == [3, 10]
