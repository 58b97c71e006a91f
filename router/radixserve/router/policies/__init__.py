"""Routing policies, built from the RouterConfig by name."""

from __future__ import annotations

from collections.abc import Callable

from radixserve.router.config import RouterConfig
from radixserve.router.policies.base import Policy, RankView, RouteRequest
from radixserve.router.policies.cache_aware import CacheAwarePolicy
from radixserve.router.policies.cost import CostPolicy
from radixserve.router.policies.simple import (
    LeastLoadPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)

__all__ = ["Policy", "RouteRequest", "RankView", "make_policy"]


def make_policy(config: RouterConfig) -> Policy:
    if config.policy == "cache_aware":
        return CacheAwarePolicy(
            config.cache_threshold,
            config.balance_abs_threshold,
            config.balance_rel_threshold,
            config.load_tokens_per_request,
        )
    if config.policy == "cost":
        return CostPolicy(config.cost_queue_weight)
    simple: dict[str, Callable[[], Policy]] = {
        "round_robin": RoundRobinPolicy,
        "random": RandomPolicy,
        "power_of_two": PowerOfTwoPolicy,
        "least_load": LeastLoadPolicy,
    }
    return simple[config.policy]()
