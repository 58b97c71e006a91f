"""`cache_aware`: SGLang's router rule, on the engines' real cached-token counts.

1. If the load is imbalanced (max − min > `balance_abs_threshold` and max > min ×
   `balance_rel_threshold`), send to the least-loaded target: cache affinity must not pile
   a tenant's burst onto one replica.
2. Otherwise take the target with the longest cached prefix; if that prefix covers more than
   `cache_threshold` of the prompt, route there (ties → lower load).
3. Else route to the least-loaded target: a miss anywhere should land where it waits least.

Unlike sgl-router, the match rate comes from the mirrored radix trees (what each engine
really holds, in tokens), not from a character tree of what the router sent.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from radixserve.router.policies.base import RouteRequest, TargetView, least_loaded


@dataclass(frozen=True)
class CacheAwarePolicy:
    cache_threshold: float = 0.3
    balance_abs_threshold: int = 64
    balance_rel_threshold: float = 1.5
    name: str = "cache_aware"
    uses_cache: bool = True

    def imbalanced(self, targets: Sequence[TargetView]) -> bool:
        loads = [t.load for t in targets]
        lo, hi = min(loads), max(loads)
        return hi - lo > self.balance_abs_threshold and hi > lo * self.balance_rel_threshold

    def select(self, request: RouteRequest, targets: Sequence[TargetView]) -> TargetView:
        if len(targets) == 1:
            return targets[0]
        if self.imbalanced(targets):
            return least_loaded(targets)
        best = max(targets, key=lambda t: (t.cached_tokens, -t.load, -t.queued_tokens))
        rate = best.cached_tokens / request.num_tokens if request.num_tokens else 0.0
        if rate > self.cache_threshold:
            return best
        return least_loaded(targets)
