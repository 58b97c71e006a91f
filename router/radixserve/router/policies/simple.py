"""Cache-blind policies: round_robin, random, power_of_two, least_load."""

from __future__ import annotations

import itertools
import random
from collections.abc import Sequence
from dataclasses import dataclass, field

from radixserve.router.policies.base import RankView, RouteRequest, least_loaded


@dataclass
class RoundRobinPolicy:
    name: str = "round_robin"
    uses_cache: bool = False
    _counter: itertools.count[int] = field(default_factory=itertools.count)

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        return views[next(self._counter) % len(views)]


@dataclass
class RandomPolicy:
    name: str = "random"
    uses_cache: bool = False
    rng: random.Random = field(default_factory=random.Random)

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        return self.rng.choice(list(views))


@dataclass
class PowerOfTwoPolicy:
    """Two distinct random ranks; the less loaded wins (ties → the first drawn)."""

    name: str = "power_of_two"
    uses_cache: bool = False
    rng: random.Random = field(default_factory=random.Random)

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        if len(views) == 1:
            return views[0]
        a, b = self.rng.sample(list(views), 2)
        return b if (b.load, b.queued_tokens) < (a.load, a.queued_tokens) else a


@dataclass(frozen=True)
class LeastLoadPolicy:
    name: str = "least_load"
    uses_cache: bool = False

    def select(self, request: RouteRequest, views: Sequence[RankView]) -> RankView:
        return least_loaded(views)
