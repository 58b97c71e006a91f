"""The policy contract: choose one rank for a request from the available ones.

A policy sees plain views (no sockets, no locks), so each one is a small pure function of
the request's cached-prefix lengths and the ranks' loads, unit-testable without a server.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from radixserve.router.addresses import RankKey


@dataclass(frozen=True)
class RankView:
    key: RankKey
    load: int  # in-flight requests (ours now + others' at the last load poll)
    queued_tokens: int  # uncached prompt tokens of our in-flight requests there
    cached_tokens: int = 0  # this request's cached prefix on the rank, in tokens
    inflight_tokens: int = 0  # its prefix among prompts routed there, not yet cached (overlay)
    cache_size_tokens: int = 0  # everything the rank's mirror holds, in tokens
    capacity_tokens: int = 0  # the rank's KV pool (engine's max_total_num_tokens); 0: unknown
    working_set_tokens: int = 0  # distinct tokens of the prompts routed there lately
    # the prefix held only in a lower tier (host), weighted by its credit (--cache-tier-credit)
    tier_credit_tokens: int = 0

    @property
    def expected_tokens(self) -> int:
        """The prefix the rank will hold when this request is prefilled: mirror ∪ overlay,
        plus the credited part a lower tier will load back. Policies score this; only
        `cached_tokens` is ever reported as cached."""
        return max(self.cached_tokens + self.tier_credit_tokens, self.inflight_tokens)


@dataclass(frozen=True)
class RouteRequest:
    num_tokens: int  # prompt length in tokens (0 when the router could not tokenize it)


class Policy(Protocol):
    @property
    def name(self) -> str:
        """The policy's config name."""
        ...

    @property
    def uses_cache(self) -> bool:
        """Whether cached_tokens must be computed for the views."""
        ...

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        """`views` is never empty."""
        ...


def least_loaded(views: Sequence[RankView]) -> RankView:
    """Smallest load; ties → fewer queued tokens, then the first (a stable order)."""
    return min(views, key=lambda v: (v.load, v.queued_tokens))
