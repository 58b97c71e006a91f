"""This step's read-only prefix matches of waiting requests (scheduler process, CPU only).

Ordering (lpm, dfs-weight) and admission both need to know how much of each waiting request is
cached. `StepPrefixMatches` peeks each request at most once per step and changes nothing in the
tree; the PrefillAdder then splits, counts hits and locks only for the requests it admits.
A memo never outlives the step that built it: the next step may see another tree.

`WaitingPins` locks the cached prefix of requests that stay waiting after a round, so the
allocations of requests admitted ahead of them (and decode steps) do not evict what they are
about to reuse. Bounded: the pinned matches sum to at most `--waiting-prefix-pin-fraction`
of the pool (default 0: off), a pin never takes what the batch just admitted needs, and the
scheduler drops every pin before a decode would retract and when an idle engine could admit
nothing (so pins never stall it).
"""

from __future__ import annotations

from typing import Any

from radixserve.engine.mem_cache.base_prefix_cache import BasePrefixCache, PrefixPeek
from radixserve.engine.scheduler.req import Req

MAX_PIN_CANDIDATES = 64  # waiting requests peeked for a pin per round, in priority order


def prefix_match_key(req: Req) -> list[int]:
    """What a request may reuse from the cache: all its tokens but the last, since at least
    one token must be computed to get the logits of the next one; and, while its prompt
    log-probabilities are wanted, none from the first position that computes one on."""
    key = req.full_ids()
    end = len(key) - 1
    if req.wants_input_logprobs and not req.input_logprobs_complete():
        end = min(end, req.input_logprob_next)
    return key[:end]


class StepPrefixMatches:
    """Read-only matches of one scheduling step, at most one per request."""

    def __init__(self, tree_cache: BasePrefixCache) -> None:
        self.tree_cache = tree_cache
        self._by_req: dict[int, PrefixPeek] = {}

    def get(self, req: Req) -> PrefixPeek:
        """The request's match this step (peeked on first use, then remembered)."""
        peek = self._by_req.get(id(req))
        if peek is None:
            peek = self.tree_cache.peek_prefix(prefix_match_key(req))
            self._by_req[id(req)] = peek
        return peek


class WaitingPins:
    """Locks on the matched prefixes of waiting requests (at most one per request). A pin
    locks the node its match ends in, without a split, hit count or access time: waiting
    still changes nothing in the tree but lock counts."""

    def __init__(self, tree_cache: BasePrefixCache, cap_tokens: int) -> None:
        self.tree_cache = tree_cache
        self.cap_tokens = cap_tokens
        # id(req) → (node locked, match length, tokens the lock covers)
        self._pins: dict[int, tuple[Any, int, int]] = {}
        self.pinned_tokens = 0  # Σ tokens covered (a prefix shared by two pins counts twice)

    def __len__(self) -> int:
        return len(self._pins)

    def match_of(self, req: Req) -> int:
        """The match length `req` is pinned at (0: not pinned)."""
        pin = self._pins.get(id(req))
        return 0 if pin is None else pin[1]

    def refresh(self, waiting: list[Req], matches: StepPrefixMatches, room: float) -> None:
        """After a round: unpin requests no longer waiting, (re)pin the waiting ones in
        priority order while the cap allows and each pin takes at most `room` evictable
        tokens (what the batch just admitted does not need)."""
        keep = set(map(id, waiting))
        for rid in [r for r in self._pins if r not in keep]:
            self._release(rid)
        for req in waiting[:MAX_PIN_CANDIDATES]:
            peek, held = matches.get(req), self._pins.get(id(req))
            if peek.length <= (0 if held is None else held[1]):
                continue  # pinned as matched (a pinned match cannot shrink), or no match
            # Its match grew (or is new): lock the new one first, then drop the old lock.
            span = self.tree_cache.lock_span(peek)
            covered = 0 if held is None else held[2]
            if self.pinned_tokens - covered + span.length > self.cap_tokens:
                continue
            taken = self.tree_cache.evictable_in_match(span)
            if taken > room:
                continue
            self.tree_cache.inc_lock_ref(span.node)
            room -= taken
            self._release(id(req))
            self._pins[id(req)] = (span.node, peek.length, span.length)
            self.pinned_tokens += span.length

    def release(self, req: Req) -> None:
        self._release(id(req))

    def release_all(self) -> bool:
        """Drop every pin; returns whether there was one."""
        held = bool(self._pins)
        for rid in list(self._pins):
            self._release(rid)
        return held

    def _release(self, rid: int) -> None:
        pin = self._pins.pop(rid, None)
        if pin is not None:
            self.tree_cache.dec_lock_ref(pin[0])
            self.pinned_tokens -= pin[2]
