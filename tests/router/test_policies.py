"""Routing policies as pure functions of (cached prefix, load) views."""

from __future__ import annotations

import random

import pytest

from radixserve.router.circuit_breaker import BreakerState, CircuitBreaker
from radixserve.router.config import RouterConfig
from radixserve.router.policies import POLICIES, RankView, RouteRequest, make_policy
from radixserve.router.policies.cache_aware import CacheAwarePolicy
from radixserve.router.policies.cost import CostPolicy
from radixserve.router.policies.simple import PowerOfTwoPolicy, RoundRobinPolicy


def view(name: str, load: int = 0, cached: int = 0, queued: int = 0, rank: int = 0) -> RankView:
    return RankView((f"http://{name}", rank), load, queued, cached)


def test_cache_aware_defaults_are_sglangs_cli_defaults() -> None:
    policy = make_policy(RouterConfig())
    assert isinstance(policy, CacheAwarePolicy)
    assert (policy.cache_threshold, policy.balance_abs_threshold, policy.balance_rel_threshold) == (
        0.3,
        64,
        1.5,
    )


def test_cache_aware_prefers_the_longest_prefix_above_threshold() -> None:
    p = CacheAwarePolicy()
    views = [view("a", load=3, cached=100), view("b", load=0, cached=400), view("c", load=1)]
    assert p.select(RouteRequest(1000), views).key[0] == "http://b"


def test_cache_aware_below_threshold_goes_to_least_loaded() -> None:
    p = CacheAwarePolicy()
    # 300 / 1000 is not > 0.3: a miss goes where the queue is shortest
    views = [view("a", load=5, cached=300), view("b", load=2), view("c", load=4)]
    assert p.select(RouteRequest(1000), views).key[0] == "http://b"
    views[0] = view("a", load=5, cached=301)
    assert p.select(RouteRequest(1000), views).key[0] == "http://a"


def test_cache_aware_imbalance_overrides_the_cache() -> None:
    p = CacheAwarePolicy()
    # max − min = 70 > 64 and 80 > 10 × 1.5: imbalanced, least loaded wins despite no cache
    views = [view("a", load=80, cached=1000), view("b", load=10)]
    assert p.select(RouteRequest(1000), views).key[0] == "http://b"
    # only the absolute gap is large; the relative one is not (100 ≤ 70 × 1.5): cache wins
    views = [view("a", load=100, cached=1000), view("b", load=70)]
    assert p.select(RouteRequest(1000), views).key[0] == "http://a"
    # only the relative gap is large (10 > 1 × 1.5) but the absolute one is 9: cache wins
    views = [view("a", load=10, cached=1000), view("b", load=1)]
    assert p.select(RouteRequest(1000), views).key[0] == "http://a"


def test_cache_aware_ties_in_cache_go_to_lower_load() -> None:
    p = CacheAwarePolicy()
    views = [view("a", load=4, cached=500), view("b", load=1, cached=500)]
    assert p.select(RouteRequest(600), views).key[0] == "http://b"


def test_cache_aware_without_tokens_is_least_load() -> None:
    p = CacheAwarePolicy()
    assert p.select(RouteRequest(0), [view("a", load=2), view("b", load=1)]).key[0] == "http://b"


def test_cost_trades_cache_against_queue_in_tokens() -> None:
    p = CostPolicy(queue_weight=1.0)
    # a: 1000 − 900 = 100 uncached + 500 queued = 600; b: 1000 uncached + 0 = 1000
    views = [view("a", cached=900, queued=500), view("b")]
    assert p.select(RouteRequest(1000), views).key[0] == "http://a"
    # a's queue grows to 1000 tokens: 1100 > 1000, the empty replica wins
    views = [view("a", cached=900, queued=1000), view("b")]
    assert p.select(RouteRequest(1000), views).key[0] == "http://b"
    # a larger weight makes queues dearer
    assert CostPolicy(queue_weight=3.0).cost(RouteRequest(1000), view("a", 0, 900, 500)) == 1600


def test_round_robin_cycles() -> None:
    p = RoundRobinPolicy()
    views = [view("a"), view("b"), view("c")]
    picked = [p.select(RouteRequest(10), views).key[0][-1] for _ in range(6)]
    assert picked == list("abcabc")


def test_power_of_two_never_picks_the_most_loaded_of_three() -> None:
    p = PowerOfTwoPolicy(rng=random.Random(0))
    views = [view("a", load=9), view("b", load=1), view("c", load=5)]
    picks = {p.select(RouteRequest(10), views).key[0] for _ in range(200)}
    assert "http://a" not in picks
    assert picks == {"http://b", "http://c"}


@pytest.mark.parametrize("name", list(POLICIES))  # the registry: every --policy name
def test_every_policy_handles_a_single_rank(name: str) -> None:
    policy = make_policy(RouterConfig(policy=name))
    only = view("only", load=100)
    assert policy.select(RouteRequest(5), [only]) is only


def test_least_load_picks_the_smallest_load_then_fewest_queued_tokens() -> None:
    policy = make_policy(RouterConfig(policy="least_load"))
    views = [view("a", load=2, queued=10), view("b", load=2, queued=5), view("c", load=3)]
    assert policy.select(RouteRequest(5), views).key[0] == "http://b"


def test_config_rejects_bad_values_naming_the_field() -> None:
    with pytest.raises(ValueError, match="^policy:"):
        RouterConfig(policy="nope")
    with pytest.raises(ValueError, match="^cache_threshold:"):
        RouterConfig(cache_threshold=1.5)
    with pytest.raises(ValueError, match="^balance_rel_threshold:"):
        RouterConfig(balance_rel_threshold=0.5)


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_circuit_breaker_opens_half_opens_and_closes() -> None:
    clock = FakeClock()
    cb = CircuitBreaker(failure_threshold=3, success_threshold=2, timeout_s=10, clock=clock)
    for _ in range(2):
        cb.record(False)
    assert cb.allows()
    cb.record(True)  # a success resets the consecutive-failure count
    for _ in range(3):
        cb.record(False)
    assert cb.state is BreakerState.OPEN and not cb.allows()
    clock.now = 9.9
    assert not cb.allows()
    clock.now = 10.0
    assert cb.state is BreakerState.HALF_OPEN and cb.allows()
    cb.record(False)  # a failure while half-open opens again at once
    assert cb.state is BreakerState.OPEN
    clock.now = 20.0
    cb.record(True)
    assert cb.state is BreakerState.HALF_OPEN
    cb.record(True)
    assert cb.state is BreakerState.CLOSED


def test_disabled_breaker_always_allows() -> None:
    cb = CircuitBreaker(failure_threshold=1, enabled=False)
    cb.record(False)
    assert cb.allows()


def test_cache_aware_load_counts_queued_prefill_tokens() -> None:
    p = CacheAwarePolicy()  # 512 queued tokens weigh as one request
    # a miss: b has fewer requests but a long cold prompt queued; a's short warm ones cost less
    views = [view("a", load=2, queued=64), view("b", load=1, queued=2048)]
    assert p.load(views[0]) == 2.125 and p.load(views[1]) == 5.0
    assert p.select(RouteRequest(1000), views).key[0] == "http://a"
    # the balance rule sees tokens too: equal request counts, 40k tokens queued on a
    assert not p.imbalanced([view("a", load=1), view("b", load=1)])
    heavy = [view("a", load=1, cached=1000, queued=40_000), view("b", load=1)]
    assert p.imbalanced(heavy) and p.select(RouteRequest(1000), heavy).key[0] == "http://b"
    with pytest.raises(ValueError, match="load_tokens_per_request"):
        CacheAwarePolicy(load_tokens_per_request=0)
    assert make_policy(RouterConfig(load_tokens_per_request=64)).load(views[0]) == 3.0  # type: ignore[attr-defined]


def test_cache_aware_scores_in_flight_prefixes_like_cached_ones() -> None:
    p = CacheAwarePolicy()
    arriving = RankView(("http://a", 0), 1, 0, cached_tokens=0, inflight_tokens=600)
    views = [arriving, view("b"), view("c", cached=100)]
    assert p.select(RouteRequest(632), views).key[0] == "http://a"
    assert arriving.expected_tokens == 600 and arriving.cached_tokens == 0


def test_cache_aware_ties_in_load_go_where_least_is_cached() -> None:
    p = CacheAwarePolicy()
    full, empty = (RankView((f"http://{n}", 0), 0, 0, 0, 0, size) for n, size in
                   (("full", 5000), ("empty", 0)))  # fmt: skip
    assert p.select(RouteRequest(600), [full, empty]).key[0] == "http://empty"
    busy_empty = RankView(("http://busy", 0), 1, 0, 0, 0, 0)
    assert p.select(RouteRequest(600), [full, busy_empty]).key[0] == "http://full"


POOL = 2048  # tokens per replica: holds about three 630-token prefixes with their questions


def pool_view(
    name: str, demand: int = 0, load: int = 0, held: int = 0, pool: int = POOL, queued: int = 0
) -> RankView:
    """`demand`: distinct tokens routed there lately; `held`: what its mirror holds."""
    return RankView((f"http://{name}", 0), load, queued, 0, 0, held, pool, demand)


@pytest.mark.parametrize(
    ("views", "want", "why"),
    [
        # pools that hold every prefix: nothing is displaced anywhere, the least loaded wins
        ([pool_view("a", 1400, load=2), pool_view("b", 1300, load=1)], "b", "both fit"),
        # b is busier but the prompt fits there; on a it pushes out part of a cached prefix
        ([pool_view("a", 1400), pool_view("b", 700, load=1)], "b", "room beats load"),
        # a is asked to hold four prompts, b and c three, each pool holds about three
        (
            [pool_view("a", 2800), pool_view("b", 2100, load=1), pool_view("c", 2100, load=2)],
            "b",
            "equally oversubscribed: least loaded",
        ),
        # load in queued prefill tokens breaks the tie, as in the rest of the policy
        ([pool_view("a", 2100, 1, queued=700), pool_view("b", 2100, 1)], "b", "queued tokens"),
        # the mirror holds more than was routed (other clients' traffic): it counts too
        ([pool_view("a", 700, held=2048), pool_view("b", 1300, load=1)], "b", "mirror counts"),
        # a mirror larger than the pool (an approximate tree) counts as a full pool, no more
        ([pool_view("a", held=10**6), pool_view("b", 2048, load=1)], "a", "held capped at pool"),
        ([pool_view("a", 2048), pool_view("b", 2048, held=2000)], "a", "full: then less held"),
        # the engine did not say its pool size: the least loaded, as without this rule
        ([pool_view("a", 2800, pool=0), pool_view("b", 700, load=1, pool=0)], "a", "unknown"),
    ],
)
def test_cache_aware_miss_goes_where_it_displaces_least(
    views: list[RankView], want: str, why: str
) -> None:
    assert CacheAwarePolicy().select(RouteRequest(700), views).key[0] == f"http://{want}", why


def test_cache_aware_displacement_is_counted_in_prompts() -> None:
    d = CacheAwarePolicy.displaced
    assert d(RouteRequest(700), pool_view("x", 1348)) == 0  # 1348 + 700 = 2048 fits exactly
    assert d(RouteRequest(700), pool_view("x", 1349)) == 1
    assert d(RouteRequest(700), pool_view("x", 2048)) == 1
    assert d(RouteRequest(700), pool_view("x", 2100)) == 2  # 752 over: two prompts' worth
    assert d(RouteRequest(700), pool_view("x", 2800)) == 3
    assert d(RouteRequest(0), pool_view("x", 4096)) == 0  # untokenized: no estimate


def test_cache_aware_room_never_overrides_a_hit_or_the_balance_rule() -> None:
    p = CacheAwarePolicy()
    hit = RankView(("http://hit", 0), 1, 0, 600, 0, 2048, POOL, 4096)
    assert p.select(RouteRequest(700), [hit, pool_view("room")]).key[0] == "http://hit"
    # imbalanced (100 vs 10 requests): the least loaded even though its pool is oversubscribed
    crowded = [pool_view("room", load=100), pool_view("full", 4096, load=10)]
    assert p.select(RouteRequest(700), crowded).key[0] == "http://full"


def _place_cold_tenants(policy: CacheAwarePolicy, pool: int) -> list[int]:
    """Nine tenants' first requests (700-token prompts) onto three replicas, one at a time, with
    the timing the decision log showed: the replica that has been given the most tenants has
    just gone idle (its requests finished first), the others still prefill one cold prompt
    each; every prompt routed to a replica counts in its demand, its mirror holds the finished
    ones (at most its pool)."""
    prompt, tenants = 700, [0, 0, 0]
    for _ in range(9):
        most = max(range(3), key=lambda i: tenants[i])
        views = []
        for i in range(3):
            busy = i != most and tenants[i] > 0
            held = min(pool, prompt * (tenants[i] - busy)) if pool else 0
            views.append(
                RankView(
                    (f"http://r{i}", 0),
                    int(busy),
                    prompt * busy,
                    0,
                    0,
                    held,
                    pool,
                    prompt * tenants[i] if pool else 0,
                )  # fmt: skip
            )
        chosen = policy.select(RouteRequest(prompt), views)
        tenants[int(chosen.key[0][-1])] += 1
    return tenants


def test_cache_aware_spreads_new_tenants_over_pools_like_pinned() -> None:
    """`pinned` puts 3/3/3 tenants on pools that hold three prefixes each; the miss rule does
    too, whichever replica is momentarily idle. Without the pool size (least loaded, the rule
    before) the idle replica collects them."""
    assert sorted(_place_cold_tenants(CacheAwarePolicy(), POOL)) == [3, 3, 3]
    assert max(_place_cold_tenants(CacheAwarePolicy(), 0)) > 3


def test_a_host_tier_prefix_counts_at_its_credit() -> None:
    device_only = RankView(("a", 0), 0, 0, cached_tokens=100)
    with_host = RankView(("b", 0), 0, 0, cached_tokens=100, tier_credit_tokens=300)
    arriving = RankView(("c", 0), 0, 0, cached_tokens=0, inflight_tokens=500)
    assert (device_only.expected_tokens, with_host.expected_tokens) == (100, 400)
    assert arriving.expected_tokens == 500
    assert make_policy(RouterConfig(policy="cache_aware")).select(
        RouteRequest(1000), [device_only, with_host]
    ).key == ("b", 0)


@pytest.mark.parametrize(
    "value", ["host", "host=2", "host=-0.1", "disk=0.5", "host=abc", "host=0.5,storage=1.2"]
)
def test_a_bad_tier_credit_is_refused_naming_the_flag(value: str) -> None:
    with pytest.raises(ValueError, match="^cache_tier_credit: "):
        RouterConfig(cache_tier_credit=value)


def test_tier_credits_parse() -> None:
    assert RouterConfig().tier_credits() == {"host": 0.75, "storage": 0.5}
    assert RouterConfig(cache_tier_credit="host=0").tier_credits() == {"host": 0.0}
