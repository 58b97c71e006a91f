"""Routing policies, built from the RouterConfig by name. POLICIES is the registry: its keys
are the names `--policy` accepts (RouterConfig takes its choices from it)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING

from radixserve.router.policies.base import Policy, RankView, RouteRequest
from radixserve.router.policies.cache_aware import CacheAwarePolicy
from radixserve.router.policies.cost import CostPolicy
from radixserve.router.policies.simple import (
    LeastLoadPolicy,
    PowerOfTwoPolicy,
    RandomPolicy,
    RoundRobinPolicy,
)

if TYPE_CHECKING:  # config imports this registry for the names, so no import back at run time
    from radixserve.router.config import RouterConfig

__all__ = ["POLICIES", "Policy", "RouteRequest", "RankView", "make_policy"]


def _cache_aware(config: RouterConfig) -> Policy:
    return CacheAwarePolicy(
        config.cache_threshold,
        config.balance_abs_threshold,
        config.balance_rel_threshold,
        config.load_tokens_per_request,
    )


POLICIES: Mapping[str, Callable[[RouterConfig], Policy]] = MappingProxyType(
    {
        "cache_aware": _cache_aware,
        "cost": lambda config: CostPolicy(config.cost_queue_weight),
        "round_robin": lambda _config: RoundRobinPolicy(),
        "random": lambda _config: RandomPolicy(),
        "power_of_two": lambda _config: PowerOfTwoPolicy(),
        "least_load": lambda _config: LeastLoadPolicy(),
    }
)


def make_policy(config: RouterConfig) -> Policy:
    return POLICIES[config.policy](config)
