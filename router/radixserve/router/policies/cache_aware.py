"""`cache_aware`: SGLang's router rule, on the workers' real cached-token counts.

Load is counted in requests, with prefill work folded in: a rank's load is its requests plus
its queued uncached prompt tokens ÷ `load_tokens_per_request`, so a long cold prompt weighs
more than a short warm one (what the `cost` policy measures directly).

1. If the load is imbalanced (max − min > `balance_abs_threshold` and max > min ×
   `balance_rel_threshold`), send to the least-loaded rank: cache affinity must not pile
   a tenant's burst onto one rank.
2. Otherwise take the rank with the longest expected prefix (cached by its mirror, or
   arriving with a request routed there and still in flight); if that prefix covers more than
   `cache_threshold` of the prompt, route there (ties → lower load).
3. Else (a miss everywhere: a new prefix, or one evicted everywhere) route where the prompt
   displaces least: the fewest prompts' worth of tokens pushed out of the pool,
   ⌈max(0, demand + prompt − pool) ÷ prompt⌉, where `pool` is the engine's KV pool
   (`max_total_num_tokens`) and `demand` what the rank is asked to hold: the distinct
   tokens of the prompts routed there lately (up to twice its pool; in flight or not) or its
   mirror, whichever is larger. Ties (the prompt fits everywhere, as in pools that hold every
   prefix; or equally oversubscribed pools) and an unknown pool size go to the least-loaded
   rank, then to the one holding the least. Load alone puts a new tenant wherever a request
   just finished, so one pool can end up cycling more prefixes than it holds while another has
   room; this rule spreads tenants by what each pool can hold, as `pinned` does, without
   knowing tenants.

Unlike sgl-router, the match rate comes from the mirrored radix trees (what each rank
really holds, in tokens) plus the in-flight overlay, not from a character tree of what the
router sent, so evictions are seen and bursts still stay together.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.router.policies.base import RankView, RouteRequest

DEFAULT_LOAD_TOKENS_PER_REQUEST = 512


@dataclass(frozen=True)
class CacheAwarePolicy:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    load_tokens_per_request: int = DEFAULT_LOAD_TOKENS_PER_REQUEST
    name: str = "cache_aware"
    uses_cache: bool = True

    def __post_init__(self) -> None:
        if self.load_tokens_per_request < 1:
            raise ValueError(
                f"load_tokens_per_request: must be ≥ 1, got {self.load_tokens_per_request}"
            )

    def load(self, view: RankView) -> float:
        """Requests in flight plus queued prefill tokens, in request units."""
        return view.load + view.queued_tokens / self.load_tokens_per_request

    def imbalanced(self, views: Sequence[RankView]) -> bool:
        loads = [self.load(v) for v in views]
        lo, hi = min(loads), max(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def load_order(self, view: RankView) -> tuple[float, int, int]:
        """Least loaded first; ties → fewer requests, then less cached."""
        return (self.load(view), view.load, view.cache_size_tokens)

    def least_loaded(self, views: Sequence[RankView]) -> RankView:
        """Smallest `load_order`; the first of equals."""
        return min(views, key=self.load_order)

    @staticmethod
    def displaced(request: RouteRequest, view: RankView) -> int:
        """How many prompts' worth of the pool this miss pushes out there (0: it fits)."""
        pool, n = view.capacity_tokens, request.num_tokens
        if pool <= 0 or n <= 0:
            return 0
        demand = max(view.working_set_tokens, min(view.cache_size_tokens, pool))
        over = demand + n - pool
        return -(-over // n) if over > 0 else 0

    def place_miss(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        """Step 3: least displaced; ties in `load_order`."""
        return min(views, key=lambda v: (self.displaced(request, v), *self.load_order(v)))

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        if len(views) == 1:
            return views[0]
        if self.imbalanced(views):
            return self.least_loaded(views)
        best = max(views, key=lambda v: (v.expected_tokens, -self.load(v)))
        rate = best.expected_tokens / request.num_tokens if request.num_tokens else 0.0
        if rate > self.cache_threshold:
            return best
        return self.place_miss(request, views)
