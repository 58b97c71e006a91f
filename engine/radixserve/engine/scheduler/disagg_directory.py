"""The decode's view of the prefill servers it is sent to: each one's topology and control
endpoints (GET /route on its bootstrap server, fetched on worker threads so the scheduler never
blocks), and its liveness (GET /health every few seconds while rooms wait on it): dead after
enough missed heartbeats, restarted when the server's session is no longer the one its
endpoints were looked up under (then they are looked up again)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from radixserve.engine.disaggregation.bootstrap import fetch_prefill_info, health_session
from radixserve.engine.disaggregation.wire import PrefillInfo
from radixserve.engine.scheduler.disagg_common import DisaggConfig

logger = logging.getLogger(__name__)

RETRY_INTERVAL_S = 1.0


@dataclass(slots=True)
class _Lookup:
    future: Future[PrefillInfo] | None = None
    failures: int = 0
    next_try: float = 0.0
    last_error: str = ""


@dataclass(slots=True)
class _Health:
    future: Future[str | None] | None = None
    misses: int = 0
    next_check: float = 0.0


@dataclass(slots=True)
class PrefillDirectory:
    config: DisaggConfig
    pool: ThreadPoolExecutor = field(
        default_factory=lambda: ThreadPoolExecutor(4, thread_name_prefix="pd-bootstrap")
    )
    infos: dict[str, PrefillInfo] = field(default_factory=dict)
    lookups: dict[str, _Lookup] = field(default_factory=dict)
    health: dict[str, _Health] = field(default_factory=dict)

    def resolve(self, address: str) -> PrefillInfo | str | None:
        """The prefill's info; an error once the retries are spent (the next call starts
        over); None while a fetch is pending."""
        info = self.infos.get(address)
        if info is not None:
            return info
        look = self.lookups.setdefault(address, _Lookup())
        now = time.monotonic()
        if look.future is None:
            if now >= look.next_try:
                look.future = self.pool.submit(fetch_prefill_info, address)
            return None
        if not look.future.done():
            return None
        try:
            info = look.future.result()
        except Exception as exc:  # connection refused, 503 while its ranks register, ...
            look.future, look.failures = None, look.failures + 1
            look.next_try, look.last_error = now + RETRY_INTERVAL_S, f"{type(exc).__name__}: {exc}"
            if look.failures >= self.config.bootstrap_retries:
                del self.lookups[address]
                return (
                    f"cannot bootstrap with prefill {address} after {look.failures} tries "
                    f"({look.last_error})"
                )
            return None
        del self.lookups[address]
        self.infos[address] = info
        return info

    def check(self, addresses: set[str]) -> tuple[set[str], set[str]]:
        """Of the prefills rooms wait on: (dead, restarted). Dead: missed enough heartbeats in
        a row. Restarted: answers under another session than its endpoints were looked up
        under. Either way its info is dropped, so it is looked up again."""
        now = time.monotonic()
        dead, restarted = set(), set()
        for address in addresses:
            h = self.health.setdefault(address, _Health(next_check=now + self.config.heartbeat_s))
            if h.future is None:
                if now >= h.next_check:
                    h.future = self.pool.submit(health_session, address)
                continue
            if not h.future.done():
                continue
            session, h.future, h.next_check = h.future.result(), None, now + self.config.heartbeat_s
            h.misses = 0 if session is not None else h.misses + 1
            known = self.infos.get(address)
            if session and known is not None and known.session and session != known.session:
                logger.warning("prefill %s restarted: looking up its endpoints again", address)
                restarted.add(address)
                self.infos.pop(address, None)
            elif h.misses >= self.config.heartbeat_failures:
                logger.warning("prefill %s missed %d heartbeats", address, h.misses)
                dead.add(address)
                self.infos.pop(address, None)
                del self.health[address]
        for address in set(self.health) - addresses:
            del self.health[address]
        return dead, restarted

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
