"""`cost`: pick the rank with the least estimated work before this request's first token.

cost = uncached prompt tokens (what this request must prefill there; in-flight prefixes count
       as cached: they will be by then)
     + `queue_weight` × tokens queued there (uncached prompt tokens of our in-flight requests);
ties go to the lower load.

A cache hit is worth exactly the prefill it saves, and a queue costs what it delays, so the
two are traded in one unit (tokens) instead of through thresholds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.router.policies.base import RankView, RouteRequest


@dataclass(frozen=True)
class CostPolicy:
    queue_weight: float = 1.0
    name: str = "cost"
    uses_cache: bool = True

    def cost(self, request: RouteRequest, view: RankView) -> float:
        uncached = max(0, request.num_tokens - view.expected_tokens)
        return uncached + self.queue_weight * view.queued_tokens

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        return min(views, key=lambda v: (self.cost(request, v), v.load))
