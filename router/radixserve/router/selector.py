"""One routing decision: available ranks → views (load, cached prefix) → policy → a lease.

A `Lease` is the in-flight accounting of one attempt: taking it bumps the rank's load and
queued tokens and puts its prompt in the rank's in-flight overlay; releasing it (exactly
once, in a `finally`, when the request ends or fails) gives them back and takes it out.
`cached_tokens` is the mirror's exact prefix (what metrics report); the overlay only steers.
Sticky sessions sit in front of the policy: a session keeps its rank while it is available.
"""

from __future__ import annotations

import logging
import time
from collections import OrderedDict
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field

from radixserve.router.addresses import RankKey
from radixserve.router.mirror.index import CacheIndex, PrefixMatch
from radixserve.router.mirror.tree import TOKEN_BYTES, decode_tokens, encode_tokens
from radixserve.router.policies import Policy, RankView, RouteRequest
from radixserve.router.workers import Worker, WorkerRegistry

logger = logging.getLogger(__name__)

MAX_SESSIONS = 100_000  # sticky-session table size; least recently used sessions go first
NO_MATCH = PrefixMatch(0)


@dataclass
class Lease:
    worker: Worker
    dp_rank: int
    num_tokens: int
    cached_tokens: int  # the mirror's prefix: the only number reported as cached
    decision_s: float
    expected_tokens: int = 0  # cached or arriving with an in-flight request (scoring only)
    on_release: Callable[[], None] | None = None
    released: bool = field(default=False)

    @property
    def uncached(self) -> int:
        """Prompt tokens this request will have to prefill there: its queued work."""
        return max(0, self.num_tokens - max(self.cached_tokens, self.expected_tokens))

    def release(self) -> None:
        if self.released:
            return
        self.released = True
        if self.on_release is not None:
            self.on_release()
        load = self.worker.load_of(self.dp_rank)
        load.in_flight -= 1
        load.in_flight_tokens -= self.uncached


class Selector:
    def __init__(
        self,
        registry: WorkerRegistry,
        index: CacheIndex,
        policy: Policy,
        host_credit: float = 0.0,
        storage_credit: float = 0.0,
    ) -> None:
        self.registry = registry
        self.index = index
        self.policy = policy
        # a host-tier / storage-tier token's worth, in KV-pool tokens (--cache-tier-credit)
        self.host_credit = host_credit
        self.storage_credit = storage_credit
        self.sessions: OrderedDict[str, RankKey] = OrderedDict()

    def views(self, tokens: Sequence[int] | None, exclude: Collection[str]) -> list[RankView]:
        return self._views(encode_tokens(tokens) if tokens else b"", exclude)

    def _views(self, q: bytes, exclude: Collection[str]) -> list[RankView]:
        """The views of a prompt encoded once (`encode_tokens`) for every tree it meets."""
        keys = [
            key for w in self.registry.available() if w.url not in exclude for key in w.rank_keys()
        ]
        cached = self.index.match_both_encoded(q, keys) if q and self.policy.uses_cache else {}
        out = []
        for url, rank in keys:
            worker = self.registry.workers[url]
            load = worker.load_of(rank)
            hit = cached.get((url, rank), NO_MATCH)
            size = self.index.size_of((url, rank))
            view = RankView(
                (url, rank),
                load.load,
                load.in_flight_tokens,
                hit.cached,
                hit.inflight,
                size,
                worker.capacity_of(rank),
                self.index.working_set_of((url, rank)),
                self.tier_credit(hit),
            )
            out.append(view)
        return out

    def choose(
        self,
        tokens: Sequence[int] | None,
        session: str | None = None,
        exclude: Collection[str] = (),
    ) -> Lease | None:
        """Pick a rank and take a lease on it; None when no rank is available."""
        return self.choose_encoded(encode_tokens(tokens) if tokens else b"", session, exclude)

    def choose_encoded(
        self, q: bytes, session: str | None = None, exclude: Collection[str] = ()
    ) -> Lease | None:
        """`choose` for a prompt given as `encode_tokens` bytes (b"": without one)."""
        start = time.perf_counter()
        views = self._views(q, exclude)
        if not views:
            return None
        num_tokens = len(q) // TOKEN_BYTES
        view = self._sticky(session, views) or self.policy.select(RouteRequest(num_tokens), views)
        if session is not None:
            self.sessions[session] = view.key
            self.sessions.move_to_end(session)
            if len(self.sessions) > MAX_SESSIONS:
                self.sessions.popitem(last=False)
        if logger.isEnabledFor(logging.DEBUG):
            _log_decision(q, view, views)
        entry = self.index.on_routed_encoded(view.key, q) if q else None
        lease = Lease(
            self.registry.workers[view.key[0]],
            view.key[1],
            num_tokens,
            view.cached_tokens,
            time.perf_counter() - start,
            view.expected_tokens,
            (lambda: self.index.on_finished(view.key, entry)) if entry is not None else None,
        )
        load = lease.worker.load_of(lease.dp_rank)
        load.in_flight += 1
        load.in_flight_tokens += lease.uncached
        return lease

    def tier_credit(self, hit: PrefixMatch) -> int:
        """The credited prefix beyond the KV pool's: host tokens past it, then storage tokens
        past both, each at its tier's credit."""
        host_extra = max(0, hit.host - hit.cached)
        storage_extra = max(0, hit.storage - max(hit.cached, hit.host))
        return int(self.host_credit * host_extra + self.storage_credit * storage_extra)

    def _sticky(self, session: str | None, views: list[RankView]) -> RankView | None:
        if session is None or session not in self.sessions:
            return None
        key = self.sessions[session]
        return next((v for v in views if v.key == key), None)


def _log_decision(q: bytes, chosen: RankView, views: list[RankView]) -> None:
    """One DEBUG line per decision: which rank (`target=`, the documented key), and what every
    rank offered (cached, arriving, load, queued tokens, mirror size, recent working set);
    `head` names the prompt's first 32 tokens (a tenant)."""
    head = hash(tuple(decode_tokens(q[: 32 * TOKEN_BYTES]))) & 0xFFFFFF if q else 0
    offered = " ".join(
        f"{v.key[0]}#{v.key[1]}:c{v.cached_tokens}:i{v.inflight_tokens}:l{v.load}"
        f":q{v.queued_tokens}:s{v.cache_size_tokens}:w{v.working_set_tokens}"
        for v in views
    )
    logger.debug(
        "route target=%s#%d prompt=%d head=%06x views=%s",
        chosen.key[0], chosen.key[1], len(q) // TOKEN_BYTES, head, offered,
    )  # fmt: skip
