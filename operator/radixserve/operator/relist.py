"""An HTTP 410 Gone answered to a watch (or list) request makes kopf list again, instead of
ending the whole operator.

kube-apiserver says "your resourceVersion is too old" in two forms. Inside a watch stream it
is an `ERROR` event with code 410; kopf handles that one and lists again. As the answer to the
watch request itself it is an HTTP 410, and a paginated list whose continue token expired
gets the same; kopf raises that as `APIClientError`, its watcher task fails, and with it the
operator ("Resource observer has failed"). client-go's reflector treats both forms alike:
list again, watch from the new resourceVersion. `install()` makes kopf do the same, by
wrapping the one function its watchers stream from (`kopf._cogs.clients.watching
.infinite_watch`, looked up by `kopf._core.reactor.queueing` at call time). Each restart
lists the resource again, so no change made meanwhile is missed.

The same goes for an API server that keeps answering 5xx (or keeps dropping the connection)
for longer than kopf's own retries (`settings.networking.error_backoffs`, about a minute by
default): kopf raises, and the operator used to end. client-go's reflector backs off and
lists again, however long the outage; here too, with a backoff that doubles from
`settings.watching.reconnect_backoff` up to MAX_OUTAGE_BACKOFF_S, one WARNING per attempt,
and back to the short backoff once a stream has run. Other 4xx are kopf's to handle, as
before.

kopf has no public hook for this; `install()` checks that the function it wraps is where it
expects and raises otherwise, so an upgrade of kopf that moves it fails loudly in the tests
(`tests/reliability/test_operator_faults.py`) rather than silently losing the fix.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
from kopf._cogs.clients import errors, watching
from kopf._core.reactor import queueing

logger = logging.getLogger(__name__)
GONE = 410
MAX_OUTAGE_BACKOFF_S = 60.0
_MARK = "_radixserve_relists_on_gone"


def gone(exc: BaseException) -> bool:
    """Whether `exc` is the API server's 410 answer to a request (an expired resourceVersion
    or continue token)."""
    return isinstance(exc, errors.APIClientError) and exc.status == GONE


def outage(exc: BaseException) -> bool:
    """Whether `exc` is what kopf raises once its own retries of a failing API are spent:
    a 5xx answer, or a connection that keeps failing."""
    return isinstance(exc, (errors.APIServerError, aiohttp.ClientConnectionError))


def relisting(stream: Callable[..., AsyncIterator[Any]]) -> Callable[..., AsyncIterator[Any]]:
    """`stream` (kopf's infinite_watch), started again, listing first, after each HTTP 410
    and after an outage that outlasted kopf's retries (with a growing backoff)."""

    async def infinite_watch(**kwargs: Any) -> AsyncIterator[Any]:
        settings = kwargs["settings"]
        backoff = settings.watching.reconnect_backoff
        while True:
            streamed = False
            try:
                async for event in stream(**kwargs):
                    streamed = True
                    yield event
                return
            except (errors.APIError, aiohttp.ClientConnectionError) as exc:
                if gone(exc):
                    logger.warning(
                        "the API server answered a watch of %s with 410 Gone: listing again",
                        kwargs.get("resource"),
                    )
                elif outage(exc):
                    backoff = settings.watching.reconnect_backoff if streamed else backoff
                    logger.warning(
                        "watching %s failed past kopf's retries (%s): listing again in %.1f s",
                        kwargs.get("resource"), exc, backoff,
                    )  # fmt: skip
                    await asyncio.sleep(backoff)
                    backoff = min(2 * backoff, MAX_OUTAGE_BACKOFF_S)
                    continue
                else:
                    raise
            await asyncio.sleep(settings.watching.reconnect_backoff)

    setattr(infinite_watch, _MARK, True)
    return infinite_watch


def install() -> None:
    """Wrap kopf's watch stream once per process (later calls change nothing)."""
    current = getattr(watching, "infinite_watch", None)
    if current is None or getattr(queueing, "watching", None) is not watching:
        raise RuntimeError(
            "kopf's watch stream is not where radixserve.operator.relist expects it "
            "(kopf._cogs.clients.watching.infinite_watch): check this kopf version"
        )
    if not getattr(current, _MARK, False):
        watching.infinite_watch = relisting(current)
