"""The stop-string oracle of the engine tests: what a request with a stop string must return,
computed from a run without it and the tokenizer's own `decode`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StopCase:
    stop: str
    num_ids: int  # ids it takes for the text to hold the stop string: the completion count
    text: str  # the text before the stop string


def completing(tokenizer: Any, ids: list[int], stop: str) -> int:
    """How many of `ids` it takes for their text to hold `stop`."""
    return next(k for k in range(1, len(ids) + 1) if stop in tokenizer.decode(ids[:k]))


def mid_token_stop(tokenizer: Any, ids: list[int], skip: int = 3) -> StopCase:
    """A stop string from an unstopped run's ids that ends inside a token: the last two
    characters before some token (after the first `skip`) and that token's text but its last
    character, where this is its first occurrence."""
    for j in range(skip, len(ids)):
        before, upto = tokenizer.decode(ids[:j]), tokenizer.decode(ids[: j + 1])
        piece = upto[len(before) :]
        stop = upto[len(before) - 2 : -1]
        if len(piece.strip()) >= 3 and len(before) >= 2 and upto.find(stop) == len(before) - 2:
            assert completing(tokenizer, ids, stop) == j + 1
            return StopCase(stop, j + 1, before[:-2])
    raise AssertionError(f"no token of 3+ characters in {tokenizer.decode(ids)!r}")
