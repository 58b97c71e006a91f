"""The decode's view of the prefill servers it is sent to: each one's topology and control
endpoints (GET /route on its bootstrap server, fetched on worker threads so the scheduler never
blocks), and its liveness (GET /health every few seconds while rooms wait on it)."""

from __future__ import annotations

import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from radixserve.engine.disaggregation.bootstrap import fetch_prefill_info, is_healthy
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
    future: Future[bool] | None = None
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

    def dead(self, addresses: set[str]) -> set[str]:
        """Of the prefills rooms wait on, those that missed enough heartbeats in a row (their
        info is dropped, so a restarted prefill is looked up again)."""
        now, out = time.monotonic(), set()
        for address in addresses:
            h = self.health.setdefault(address, _Health(next_check=now + self.config.heartbeat_s))
            if h.future is None:
                if now >= h.next_check:
                    h.future = self.pool.submit(is_healthy, address)
                continue
            if not h.future.done():
                continue
            ok, h.future, h.next_check = h.future.result(), None, now + self.config.heartbeat_s
            h.misses = 0 if ok else h.misses + 1
            if h.misses >= self.config.heartbeat_failures:
                logger.warning("prefill %s missed %d heartbeats", address, h.misses)
                out.add(address)
                self.infos.pop(address, None)
                del self.health[address]
        for address in set(self.health) - addresses:
            del self.health[address]
        return out

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)
