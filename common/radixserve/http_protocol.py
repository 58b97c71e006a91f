"""uvicorn's HTTP protocols with a deadline for request headers, for the engine and the router.

uvicorn closes a keep-alive connection that stays idle after a response, but not one that
never sends a complete request: a client that opens sockets and sends nothing, or half a
header line (slowloris), holds a file descriptor and a protocol object for as long as it
likes. Here the headers of each request must be complete within `header_timeout_s` of the
connection being made (or of the previous response ending); if not, the connection is closed.
A request whose headers arrived is not limited: its body and response take as long as they
take (the route's own timeouts apply).

The deadline is a mixin over either of uvicorn's parsers: the engine serves with h11's (pure
Python), the router, whose CPU per request is what it costs, with httptools' (C).
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from uvicorn.protocols.http.h11_impl import H11Protocol

DEFAULT_HEADER_TIMEOUT_S = 30.0
HEADER_TIMEOUT_ENV = "RADIXSERVE_HEADER_TIMEOUT_S"


def header_timeout_from_env() -> float:
    """$RADIXSERVE_HEADER_TIMEOUT_S (seconds, > 0), else the default."""
    raw = os.environ.get(HEADER_TIMEOUT_ENV, "").strip()
    if not raw:
        return DEFAULT_HEADER_TIMEOUT_S
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{HEADER_TIMEOUT_ENV}: expected seconds > 0, got {raw!r}") from None
    if not value > 0:
        raise ValueError(f"{HEADER_TIMEOUT_ENV}: expected seconds > 0, got {value}")
    return value


class HeaderDeadline(asyncio.Protocol):
    """Mixed in before a uvicorn protocol class (it reads `cycle`, `loop` and `transport`)."""

    header_timeout_s: float = DEFAULT_HEADER_TIMEOUT_S
    cycle: Any
    loop: asyncio.AbstractEventLoop
    transport: asyncio.Transport
    _header_timer: asyncio.TimerHandle | None = None
    _armed_cycle: object = None

    def _arm(self) -> None:
        """Wait for a request that starts a cycle other than the current one."""
        self._disarm()
        self._armed_cycle = self.cycle
        self._header_timer = self.loop.call_later(self.header_timeout_s, self._on_timeout)

    def _disarm(self) -> None:
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None

    def _on_timeout(self) -> None:
        self._header_timer = None
        if self.cycle is self._armed_cycle and not self.transport.is_closing():
            self.transport.close()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)  # uvicorn's protocol: next in the MRO
        self._arm()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        if self.cycle is not self._armed_cycle:  # the headers of a new request are complete
            self._disarm()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # type: ignore[misc]  # uvicorn's, not asyncio's
        if not self.transport.is_closing():
            self._arm()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm()
        super().connection_lost(exc)


class HeaderTimeoutProtocol(HeaderDeadline, H11Protocol):
    pass


def header_timeout_protocol(
    seconds: float | None = None, parser: str = "h11"
) -> type[asyncio.Protocol]:
    """The protocol class to give uvicorn (`http=`), with the deadline of this process, over
    uvicorn's `parser` ("h11" or "httptools": imported only when asked for)."""
    timeout = header_timeout_from_env() if seconds is None else seconds
    base: type[asyncio.Protocol] = HeaderTimeoutProtocol
    if parser == "httptools":
        from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

        base = type("HttpToolsHeaderTimeoutProtocol", (HeaderDeadline, HttpToolsProtocol), {})
    elif parser != "h11":
        raise ValueError(f"parser: expected h11 or httptools, got {parser!r}")
    return type(base.__name__, (base,), {"header_timeout_s": timeout})
