"""A per-worker circuit breaker (sgl-router's state machine).

Closed → Open after `failure_threshold` consecutive failed requests; Open → HalfOpen once
`timeout_s` has passed (one probe at a time may go through); HalfOpen → Closed after
`success_threshold` consecutive successes, back to Open on any failure. A failure is a
transport error or a 5xx from the worker; a client's 4xx says nothing about the worker.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from enum import Enum


class BreakerState(str, Enum):
    CLOSED = "closed"
    OPEN = "open"
    HALF_OPEN = "half_open"


class CircuitBreaker:
    def __init__(
        self,
        failure_threshold: int = 10,
        success_threshold: int = 3,
        timeout_s: float = 30.0,
        enabled: bool = True,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.failure_threshold = failure_threshold
        self.success_threshold = success_threshold
        self.timeout_s = timeout_s
        self.enabled = enabled
        self._clock = clock
        self._state = BreakerState.CLOSED
        self._failures = 0
        self._successes = 0
        self._opened_at = 0.0

    @property
    def state(self) -> BreakerState:
        if self._state is BreakerState.OPEN and self._clock() - self._opened_at >= self.timeout_s:
            self._state = BreakerState.HALF_OPEN
            self._successes = 0
        return self._state

    def allows(self) -> bool:
        return not self.enabled or self.state is not BreakerState.OPEN

    def record(self, success: bool) -> None:
        if not self.enabled:
            return
        state = self.state
        if success:
            self._failures = 0
            if state is BreakerState.HALF_OPEN:
                self._successes += 1
                if self._successes >= self.success_threshold:
                    self._state = BreakerState.CLOSED
            return
        self._successes = 0
        self._failures += 1
        if state is BreakerState.HALF_OPEN or self._failures >= self.failure_threshold:
            self._state = BreakerState.OPEN
            self._opened_at = self._clock()
            self._failures = 0

    def reset(self) -> None:
        self._state = BreakerState.CLOSED
        self._failures = self._successes = 0
